"""The llama-server build script: cached by recipe, overridable, and clear when tools are missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamafleet_local import llama_build


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(tmp_path))
    monkeypatch.delenv(llama_build.ENV_BINARY, raising=False)
    return tmp_path


def _fake_binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_cached_binary_is_reused_without_building_when_present(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second run finds the binary of the same recipe and never calls CMake."""
    binary = _fake_binary(cache / "llama-server" / llama_build.build_key() / "llama-server")

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not build when the cached binary exists")

    monkeypatch.setattr(llama_build, "_build_into", no_build)
    assert llama_build.build() == binary


def test_own_binary_is_used_when_the_environment_names_one(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = _fake_binary(cache / "mine" / "llama-server")
    monkeypatch.setenv(llama_build.ENV_BINARY, str(own))
    assert llama_build.build() == own
    monkeypatch.setenv(llama_build.ENV_BINARY, str(cache / "missing"))
    with pytest.raises(llama_build.BuildError, match="not an executable file"):
        llama_build.build()


def test_build_fails_clearly_when_cmake_or_compiler_is_missing(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_build.shutil, "which", lambda name: None)
    with pytest.raises(llama_build.BuildError) as err:
        llama_build.build()
    message = str(err.value)
    assert "cmake" in message and "C++ compiler" in message and llama_build.ENV_BINARY in message


def test_build_key_changes_when_the_recipe_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = llama_build.build_key()
    monkeypatch.setattr(llama_build, "CMAKE_FLAGS", (*llama_build.CMAKE_FLAGS, "-DGGML_AVX512=OFF"))
    assert llama_build.build_key() != before


def test_cli_prints_the_binary_path(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = _fake_binary(cache / "llama-server" / llama_build.build_key() / "llama-server")
    assert llama_build.main([]) == 0
    assert capsys.readouterr().out.strip() == str(binary)
    assert os.access(binary, os.X_OK)

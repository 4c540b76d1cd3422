"""The llama-server build script: cached by recipe, overridable, and clear when tools are missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamafleet_testbed import llama_build


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


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f
bugs\t\t: spectre_v1

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f
"""


def _key_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpuinfo: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(llama_build, "CPUINFO", path)
    return llama_build.build_key()


def test_build_key_follows_the_cpu_flags_not_only_the_model_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """-march=native: the same model name without AVX-512 (a VM hiding it) must not reuse the binary."""
    base = _key_with(monkeypatch, tmp_path, X86)
    assert _key_with(monkeypatch, tmp_path, X86.replace(" avx512f", "")) != base
    assert _key_with(monkeypatch, tmp_path, X86.replace("Xeon(R) Processor", "EPYC 9654")) != base


def test_build_key_is_stable_on_one_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Same CPU, same key: on every call, whatever the order of cores or of flags within a line, and
    whatever else /proc/cpuinfo says (bugs, MHz)."""
    base = _key_with(monkeypatch, tmp_path, X86)
    assert _key_with(monkeypatch, tmp_path, X86) == base
    reordered = X86.replace("fpu sse2 avx avx2 avx512f", "avx512f avx2 fpu avx sse2", 1)
    assert _key_with(monkeypatch, tmp_path, reordered) == base
    noise = X86.replace("spectre_v1", "spectre_v2") + "cpu MHz\t: 1.0\n"
    assert _key_with(monkeypatch, tmp_path, noise) == base
    monkeypatch.setattr(llama_build, "CPUINFO", Path("/proc/cpuinfo"))
    assert llama_build.build_key() == llama_build.build_key()


def test_cpu_identity_reads_arm_features_and_survives_a_missing_cpuinfo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n"
    assert llama_build.cpu_identity(arm) != llama_build.cpu_identity(arm.replace(" sve", ""))
    assert "flags sha256" in llama_build.cpu_identity(X86)
    monkeypatch.setattr(llama_build, "CPUINFO", tmp_path / "absent")
    assert llama_build.cpu_identity() == llama_build.platform.machine()


def test_the_cache_layout_is_version_then_key() -> None:
    """llama-server/<sdist version>-<12 hex>/llama-server, as before the flags joined the key."""
    version, _, digest = llama_build.build_key().partition("-")
    assert version == llama_build.SDIST_VERSION and len(digest) == 12
    int(digest, 16)


def test_amx_is_turned_off_where_the_cpu_lists_it_and_the_kernel_gives_no_tile_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A VM may list amx_tile without enabling the tile state (XTILEDATA, bit 18): a -march=native build
    then ran ggml's AMX kernels into a SIGSEGV. Only there is AMX turned off, and the key says so."""
    amx = X86.replace(" avx512f", " avx512f amx_tile amx_int8 amx_bf16")
    xtiledata = 1 << 18
    assert not llama_build.amx_unusable({"avx512f"}, None)
    assert not llama_build.amx_unusable({"amx_tile"}, 0x200e7 | xtiledata)
    assert llama_build.amx_unusable({"amx_tile"}, 0x200e7)  # such a VM's ARCH_GET_XCOMP_SUPP
    assert llama_build.amx_unusable({"amx_tile"}, None)  # the kernel could not say: off, to be safe

    def flags(cpuinfo: str, states: int | None) -> tuple[str, ...]:
        monkeypatch.setattr(llama_build, "kernel_xstates", lambda: states)
        return llama_build.cmake_flags(cpuinfo)

    off = f"-DCMAKE_CXX_FLAGS={llama_build.NO_AMX_FLAGS}"
    assert flags(X86, None) == flags(amx, xtiledata) == llama_build.CMAKE_FLAGS
    assert off in flags(amx, 0x200e7) and "-DGGML_NATIVE=ON" in flags(amx, 0x200e7)
    path = tmp_path / "cpuinfo"
    path.write_text(amx)
    monkeypatch.setattr(llama_build, "CPUINFO", path)
    monkeypatch.setattr(llama_build, "kernel_xstates", lambda: 0x200e7)
    without_tiles = llama_build.build_key()
    monkeypatch.setattr(llama_build, "kernel_xstates", lambda: 0x200e7 | xtiledata)
    assert llama_build.build_key() != without_tiles  # a binary built with AMX is never reused without


def test_the_kernels_states_are_read_on_x86_64_linux_only() -> None:
    states = llama_build.kernel_xstates()
    if llama_build.sys.platform == "linux" and llama_build.platform.machine() == "x86_64":
        assert states is not None and states & 0b11 == 0b11  # x87 and SSE state, on every x86-64
    else:
        assert states is None

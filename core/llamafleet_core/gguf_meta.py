"""What a GGUF file's metadata says about how llama-server can reuse a slot's cache.

An attention-only model's KV cache can be cut anywhere: a slot holding A+B serves A+C from the end of A.
A model with recurrent layers (Mamba, RWKV, gated delta nets, short convolutions: every "hybrid") or a
sliding window (without `--swa-full`) cannot step back: llama-server resumes such a slot only from a
context checkpoint at or before the common prefix, and otherwise computes the whole prompt again
(reference/llama-server.md section 3). The router must know which kind a pod serves, or it predicts reuse
that the server cannot give (measured: a slot "hit" for a new question on the tiny hybrid model resumed
~500 tokens early, at the checkpoint `n_ubatch + 4` before the previous prompt's end).

The kind is read from the file, not from a list of architecture names: the keys that size recurrent state
or a window exist exactly for those layers. Only the metadata is read (stdlib `struct`, no `gguf`
package in the agent's image); large arrays (the vocabulary) are skipped, not decoded.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, Literal

ResumeKind = Literal["anywhere", "checkpoints"]

# Per-architecture keys (`<arch>.<suffix>`) present only for layers whose state cannot be rolled back.
_RECURRENT_SUFFIXES = ("ssm.state_size", "ssm.conv_kernel", "wkv.head_size", "shortconv.l_cache")
_WINDOW_SUFFIX = "attention.sliding_window"

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 100_000  # far beyond any real file: a corrupt count must not loop for hours
_MAX_STRING = 1 << 24


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


class _Cursor:
    """Reads little-endian values from a mapped file, bounds-checked."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise GGUFError("truncated metadata")
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise GGUFError("truncated metadata")
        self.pos += n

    def string(self, *, keep: bool = True) -> str | None:
        n = self.take("<Q")
        if n > _MAX_STRING:
            raise GGUFError(f"string of {n} bytes")
        start = self.pos
        self.skip(n)
        return bytes(self.data[start:self.pos]).decode("utf-8", errors="replace") if keep else None

    def _skip_strings(self, count: int) -> None:
        data, pos, end = self.data, self.pos, len(self.data)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFError("truncated metadata")
            pos += 8 + unpack(data, pos)[0]
        if pos > end:
            raise GGUFError("truncated metadata")
        self.pos = pos

    def value(self, kind: int, *, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string(keep=keep)
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if keep:
                return [self.value(item, keep=True) for _ in range(count)]
            if item in _SCALARS:  # fixed-size items: one jump
                self.skip(count * struct.calcsize(_SCALARS[item]))
            elif item == _STRING:  # the vocabulary: ~150K strings, walked without decoding
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item, keep=False)
            return None
        raise GGUFError(f"unknown value type {kind}")


def read_metadata(path: Path, *, arrays: bool = False) -> dict[str, Any]:
    """The file's key/value metadata (array values are None unless `arrays`)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cur = _Cursor(data)
        if bytes(data[:4]) != b"GGUF":
            raise GGUFError(f"{path.name}: not a GGUF file")
        cur.skip(4)
        version = cur.take("<I")
        if version < 2:
            raise GGUFError(f"{path.name}: GGUF version {version} is not supported")
        cur.take("<Q")  # tensor count
        n_kv = cur.take("<Q")
        if n_kv > _MAX_KEYS:
            raise GGUFError(f"{path.name}: {n_kv} metadata keys")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            assert key is not None
            kind = cur.take("<I")
            meta[key] = cur.value(kind, keep=arrays or kind != _ARRAY)
        return meta


def resume_kind(meta: dict[str, Any], *, swa_full: bool = False) -> ResumeKind:
    """Pure: "checkpoints" when a slot can only resume where llama-server saved a context checkpoint."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return "anywhere"
    if any(f"{arch}.{suffix}" in meta for suffix in _RECURRENT_SUFFIXES):
        return "checkpoints"
    return "checkpoints" if sliding_window(meta, swa_full=swa_full) else "anywhere"


def sliding_window(meta: dict[str, Any], *, swa_full: bool = False) -> int | None:
    """Pure: the model's attention window in tokens, None without one (or with `--swa-full`, whose
    cache keeps every cell)."""
    arch = meta.get("general.architecture")
    window = meta.get(f"{arch}.{_WINDOW_SUFFIX}") if isinstance(arch, str) else None
    if swa_full or not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    return window


def model_sliding_window(path: Path, *, swa_full: bool = False) -> int | None:
    """`sliding_window` of a model file; None when it cannot be read."""
    try:
        return sliding_window(read_metadata(path), swa_full=swa_full)
    except (OSError, ValueError, struct.error):
        return None


def model_resume_kind(path: Path, *, swa_full: bool = False) -> ResumeKind:
    """`resume_kind` of a model file; "anywhere" when it cannot be read (what the router assumed before)."""
    try:
        return resume_kind(read_metadata(path), swa_full=swa_full)
    except (OSError, ValueError, struct.error):  # ValueError: GGUFError, or mmap of an empty file
        return "anywhere"

"""The snapshot manifest and the compatibility fingerprint, shared by the agent and the router.

llama-server's slot file holds tokens and raw KV/recurrent state and nothing that identifies the model or the
KV layout (reference/llama-server.md section 4): a file restored into a pod with another model or another
cache type either fails late or, worse, restores garbage that the server then reuses. So every snapshot
travels with a manifest whose `Fingerprint` names everything the restore depends on, and a snapshot is
restored only where the fingerprints agree (`fingerprint_mismatch(...) is None`).

Everything here is pure: no I/O, so both sides compute the same answers from the same data.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


class Fingerprint(BaseModel):
    """What must be equal between the pod that saved a slot and the pod that restores it.

    `n_slots` matters only without a unified KV cache: the file records one stream per slot then
    ("n_stream mismatch" otherwise), while a unified cache has a single stream whatever `-np` is.
    `n_ctx_slot` is informational: a larger context on the target is fine, and the server itself refuses
    a snapshot that does not fit, so it is never compared.
    """

    model_config = ConfigDict(frozen=True)

    model_sha256: str
    build: str  # `/props` build_info: the state file version can change between builds
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "on"  # decides v_trans; pin it, "auto" can resolve differently per device
    kv_unified: bool = False
    n_slots: int = 1
    swa_full: bool = False
    attn_rot_disabled: bool = False  # LLAMA_ATTN_ROT_DISABLE changes n_rot_k/n_rot_v in the file
    n_ctx_slot: int | None = None


# (field, label) in the order a reason names them; the first difference wins.
_COMPARED: tuple[tuple[str, str], ...] = (
    ("model_sha256", "model digest"),
    ("build", "server build"),
    ("cache_type_k", "cache_type_k"),
    ("cache_type_v", "cache_type_v"),
    ("flash_attn", "flash_attn"),
    ("kv_unified", "kv_unified"),
    ("swa_full", "swa_full"),
    ("attn_rot_disabled", "attn_rot_disabled"),
)


def fingerprint_mismatch(a: Fingerprint, b: Fingerprint) -> str | None:
    """A human reason naming the first field that differs, or None when `a` restores where `b` runs."""
    for field, label in _COMPARED:
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            if field == "model_sha256":
                return f"model digest differs ({va[:12]} != {vb[:12]})"
            return f"{label} {va} != {vb}"
    if not a.kv_unified and a.n_slots != b.n_slots:
        return f"n_slots {a.n_slots} != {b.n_slots} (per-slot KV needs the same -np)"
    return None


def valid_snapshot_name(name: str) -> bool:
    """Names become file names in the snapshot folder: `[A-Za-z0-9._-]`, 1..128 chars.

    No slash (no subfolder, no absolute path), no `..` (no traversal, and llama-server refuses it anyway),
    no leading dot (the agent's own temp and cache files start with a dot, so they can never collide with
    a snapshot), no trailing dot (llama-server's filename check refuses it).
    """
    return (
        _NAME_RE.fullmatch(name) is not None
        and not name.startswith(".")
        and not name.endswith(".")
        and ".." not in name
    )


def tokens_sha256(tokens: Sequence[int]) -> str:
    """Digest of a token id list: sha256 of the ids as little-endian int32 (llama_token's layout)."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


class SnapshotManifest(BaseModel):
    """The sidecar `<name>.json` of `<name>.bin`: what the file holds and where it may be restored."""

    name: str
    fingerprint: Fingerprint
    n_tokens: int
    tokens_sha256: str
    blocks: list[str] = Field(default_factory=list)  # block-chain hashes of the rendered prefix, if known
    block_chars: int = 0  # block size those hashes were cut with (0 when `blocks` is empty)
    # The exact text the snapshot holds: the first `n_chars` characters of the rendered prompt, with
    # `text_hash` = `types.exact_text_hash` of them (0 and "" when unknown). With them the index entry
    # can be rebuilt from the manifest alone, e.g. after Redis restarted empty.
    n_chars: int = 0
    text_hash: str = ""
    model: str = ""  # the fleet's model name, for people reading the manifest
    size: int = Field(ge=0)  # bytes of the .bin file
    sha256: str  # of the .bin file
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    pinned: bool = False  # evicted last (SharedPrefix snapshots)
    source_pod: str = ""  # the pod whose slot was saved
    # HMAC of every other field with the agents' manifest key (`snapshot_signing.py`): the folder is
    # writable by llama-server's container too, so a manifest without a valid one is not the agent's.
    signature: str = ""


class RestoreResult(BaseModel):
    """What a restore did: tokens now in the slot and where the time went."""

    name: str
    slot: int
    n_tokens: int
    verify_ms: float  # checksum and fingerprint check in the agent
    restore_ms: float  # llama-server's own file I/O (excludes queueing behind a busy slot)
    total_ms: float

"""Pure helpers of `llamafleet_core.snapshot`: names, fingerprints, token digests."""

from __future__ import annotations

import hashlib
import struct

import pytest

from llamafleet_core.snapshot import Fingerprint, fingerprint_mismatch, tokens_sha256, valid_snapshot_name

BASE = Fingerprint(model_sha256="a" * 64, build="b1-abc", cache_type_k="f16", cache_type_v="f16",
                   flash_attn="on", kv_unified=False, n_slots=4, swa_full=False)


@pytest.mark.parametrize("name", ["p", "prefix-1.v2", "A_b-c.d", "x" * 128, "a.b"])
def test_name_accepted_when_plain(name: str) -> None:
    assert valid_snapshot_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "../x", "/etc/passwd", "a/b", "..", ".", ".hidden", "a..b", "x" * 129, "a b", "trailing.",
     "a\\b", "naïve", "a\x00b", "%2e%2e"],
)
def test_name_refused_when_unsafe(name: str) -> None:
    """Anything that could leave the folder, hide among the agent's own dot-files, or upset the server."""
    assert not valid_snapshot_name(name)


def test_fingerprint_matches_when_identical() -> None:
    assert fingerprint_mismatch(BASE, BASE.model_copy()) is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"model_sha256": "b" * 64}, "model digest differs"),
        ({"build": "b2-def"}, "server build b1-abc != b2-def"),
        ({"cache_type_k": "q8_0"}, "cache_type_k f16 != q8_0"),
        ({"cache_type_v": "q4_0"}, "cache_type_v f16 != q4_0"),
        ({"flash_attn": "off"}, "flash_attn on != off"),
        ({"kv_unified": True}, "kv_unified False != True"),
        ({"swa_full": True}, "swa_full False != True"),
        ({"attn_rot_disabled": True}, "attn_rot_disabled False != True"),
        ({"n_slots": 2}, "n_slots 4 != 2"),
    ],
)
def test_fingerprint_reason_names_field_when_it_differs(change: dict[str, object], expected: str) -> None:
    reason = fingerprint_mismatch(BASE, BASE.model_copy(update=change))
    assert reason is not None and reason.startswith(expected)


def test_slot_count_ignored_when_kv_unified() -> None:
    """A unified cache writes one stream whatever -np is, so the slot count may differ."""
    a = BASE.model_copy(update={"kv_unified": True, "n_slots": 4})
    assert fingerprint_mismatch(a, a.model_copy(update={"n_slots": 1})) is None


def test_context_size_ignored_when_it_differs() -> None:
    """A larger context on the target is fine; the server refuses what does not fit."""
    a = BASE.model_copy(update={"n_ctx_slot": 4096})
    assert fingerprint_mismatch(a, a.model_copy(update={"n_ctx_slot": 8192})) is None


def test_tokens_digest_is_sha256_of_little_endian_int32() -> None:
    ids = [1, 151643, 0, 42]
    assert tokens_sha256(ids) == hashlib.sha256(struct.pack("<4i", *ids)).hexdigest()
    assert tokens_sha256(ids) != tokens_sha256(ids[:-1])

"""The snapshot folder: state-file parsing, model digest cache, byte budget and LRU eviction."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from llamafleet_agent import files
from llamafleet_agent.store import Refused, SnapshotStore
from llamafleet_core.snapshot import Fingerprint, SnapshotManifest

FP = Fingerprint(model_sha256="a" * 64, build="b1")
KEY = b"k" * 32  # the manifest key (an agent derives it from its token)


def _state_file(path: Path, tokens: list[int]) -> None:
    """A slot file as llama-server writes it: header, tokens payload, then (here fake) KV bytes."""
    payload = struct.pack(f"<iII{len(tokens)}iI", -1, 1, len(tokens), *tokens, 0)
    header = struct.pack("<III", files.LLAMA_STATE_SEQ_MAGIC, 4, len(payload) // 4)
    path.write_bytes(header + payload + b"kv" * 8)


def _put(store: SnapshotStore, name: str, size: int, *, pinned: bool = False) -> SnapshotManifest:
    store.bin_path(name).write_bytes(b"x" * size)
    m = SnapshotManifest(name=name, fingerprint=FP, n_tokens=1, tokens_sha256="t", size=size, sha256="s",
                         pinned=pinned)
    store.write_manifest(m)
    return m


def test_state_tokens_read_when_file_is_a_slot_file(tmp_path: Path) -> None:
    _state_file(tmp_path / "s.bin", [5, 6, 151000])
    assert files.read_state_tokens(tmp_path / "s.bin") == [5, 6, 151000]


def test_state_tokens_refused_when_not_a_slot_file(tmp_path: Path) -> None:
    (tmp_path / "s.bin").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(ValueError):
        files.read_state_tokens(tmp_path / "s.bin")


def test_symlink_refused_when_opening(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"secret")
    (tmp_path / "link.bin").symlink_to(tmp_path / "real")
    with pytest.raises(files.SymlinkRefused):
        files.sha256_file_sync(tmp_path / "link.bin")


async def test_model_digest_reused_when_file_unchanged(tmp_path: Path) -> None:
    """The cache is keyed by (path, size, mtime): a rewrite is hashed again, an unchanged file is not."""
    model, cache = tmp_path / "m.gguf", tmp_path / ".digest.json"
    model.write_bytes(b"model-one")
    first = await files.model_digest(model, cache)
    # Poison the cached digest: if the cache is used, we get the poison back.
    data = json.loads(cache.read_text())
    cache.write_text(json.dumps({**data, "sha256": "cached"}))
    assert await files.model_digest(model, cache) == "cached"
    model.write_bytes(b"model-two, longer")
    second = await files.model_digest(model, cache)
    assert second not in (first, "cached") and len(second) == 64


def test_eviction_takes_least_recently_used_unpinned_first(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=300, signing_key=KEY)
    _put(store, "old-pinned", 100, pinned=True)
    _put(store, "old", 100)
    _put(store, "new", 100)
    store.touch("old-pinned")
    store._last_used["old-pinned"] -= 100  # older than everything
    store._last_used["old"] -= 50
    evicted = store.evict_for(100, frozenset({"incoming"}))
    assert [m.name for m in evicted] == ["old"]
    assert {m.name for m in store.list_all()} == {"old-pinned", "new"}
    evicted = store.evict_for(300)  # only pinned is left, and it goes too
    assert [m.name for m in evicted] == ["new", "old-pinned"]


def test_eviction_skips_snapshot_when_in_use_or_kept(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=100, signing_key=KEY)
    _put(store, "busy", 100)
    _put(store, "kept", 100)
    with store.in_use("busy"):
        assert store.evict_for(100, frozenset({"kept"})) == []
        with pytest.raises(Refused):
            store.delete("busy")
    assert [m.name for m in store.evict_for(100, frozenset({"kept"}))] == ["busy"]
    assert not store.bin_path("busy").exists()


def test_store_refuses_name_when_traversal(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=100, signing_key=KEY)
    for bad in ("../x", "/etc/passwd", ".hidden"):
        with pytest.raises(Refused) as err:
            store.bin_path(bad)
        assert err.value.status == 400


def test_listing_skips_symlinked_manifest_and_temps_cleaned(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, budget_bytes=1000, signing_key=KEY)
    m = _put(store, "real", 10)
    (tmp_path / "elsewhere.json").write_text(m.model_copy(update={"name": "evil"}).model_dump_json())
    (tmp_path / "evil.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / ".pull-abc.bin").write_bytes(b"partial")
    assert [x.name for x in store.list_all()] == ["real"]
    assert store.cleanup_temps() == 1 and not (tmp_path / ".pull-abc.bin").exists()


async def test_digests_hash_a_file_once_per_version_and_again_after_any_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore's checksum comes from memory while the file is unchanged; a byte flipped in place,
    even with its mtime set back, makes it read again (ctime moves), so corruption is still caught."""
    reads: list[Path] = []
    real = files.sha256_file

    async def counting(path: Path) -> tuple[str, int]:
        reads.append(path)
        return await real(path)

    monkeypatch.setattr(files, "sha256_file", counting)
    path = tmp_path / "s.bin"
    path.write_bytes(b"x" * 1000)
    digests = files.Digests()
    first = await digests.sha256(path)
    assert first == (hashlib.sha256(b"x" * 1000).hexdigest(), 1000)
    assert await digests.sha256(path) == first and len(reads) == 1
    st = path.stat()
    await asyncio.sleep(0.01)  # a coarse clock must still see the change's ctime move
    path.write_bytes(b"y" + b"x" * 999)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (await digests.sha256(path))[0] == hashlib.sha256(b"y" + b"x" * 999).hexdigest()
    assert len(reads) == 2
    digests.remember(path, files.file_version(path), "known", 1000)  # the agent wrote and hashed it
    assert await digests.sha256(path) == ("known", 1000) and len(reads) == 2
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    with pytest.raises(files.SymlinkRefused):
        await digests.sha256(link)
    with pytest.raises(FileNotFoundError):
        await digests.sha256(tmp_path / "missing.bin")

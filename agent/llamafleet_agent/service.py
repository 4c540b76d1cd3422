"""Save, pull and restore: the agent's three operations, with every check that guards a restore.

The checks are ordered so that nothing unverified ever reaches a slot or a real file name:
- save writes to a dot-temp name, reads the token list back from the file, then renames; its manifest
  is signed (`store.py`);
- pull (`pull.py`) accepts only a signed manifest from a peer inside `peer_networks`, charges the budget
  with the bytes received, and renames only a file whose size, sha256 and token hash verified;
- restore checks the file's sha256 against its manifest every time, hashing the file again whenever
  it changed in any way since it was hashed (`files.Digests`: inode, size, mtime and ctime, which user
  space cannot set back), since a snapshot that restores garbage is reused silently by the server
  (docs/design.md, "Measurements behind the rules", for what hashing costs). After the restore, the
  server's own count of the tokens it restored and of the bytes it read must equal the manifest's: a
  file swapped between the agent's check and the server's open is erased from the slot and deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, Protocol

import httpx

from llamafleet_agent import files
from llamafleet_agent.files import Digests, SymlinkRefused, file_version, read_state_tokens, sha256_file
from llamafleet_agent.metrics import AgentMetrics
from llamafleet_agent.pull import PeerPuller
from llamafleet_agent.settings import AgentSettings
from llamafleet_agent.store import Refused, SnapshotStore
from llamafleet_core.llama_client import LlamaError
from llamafleet_core.snapshot import (
    Fingerprint,
    RestoreResult,
    SnapshotManifest,
    fingerprint_mismatch,
    tokens_sha256,
)


class LlamaLike(Protocol):
    """What the agent needs of `llamafleet_core.llama_client.LlamaClient`."""

    async def health(self) -> bool: ...
    async def props(self) -> dict[str, Any]: ...
    async def tokenize(self, content: str, add_special: bool = True) -> list[int]: ...
    async def prefill(
        self, prompt: str | list[int], slot: int, timeout: float | None = None
    ) -> dict[str, Any]: ...
    async def save_slot(self, slot: int, filename: str) -> dict[str, Any]: ...
    async def restore_slot(self, slot: int, filename: str) -> dict[str, Any]: ...
    async def erase_slot(self, slot: int) -> dict[str, Any]: ...


def _llama_refusal(op: str, exc: LlamaError) -> Refused:
    status = 400 if exc.status == 400 else 502
    return Refused("llama", f"llama-server refused the {op}: {exc}", status)


class SnapshotService:
    def __init__(
        self,
        settings: AgentSettings,
        store: SnapshotStore,
        llama: LlamaLike,
        http: httpx.AsyncClient,
        metrics: AgentMetrics,
        token: str,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llama = llama
        self.http = http
        self.metrics = metrics
        self._digest: asyncio.Future[str] | None = None
        self._server: tuple[str, int | None] | None = None  # (build_info, per-slot n_ctx)
        self.digests = Digests()  # a restore re-reads a file only when it changed since it was hashed
        # Snapshots the pod's readiness requires (`required.py`): never evicted to make room.
        self.required: frozenset[str] = frozenset()
        self._puller = PeerPuller(settings, store, http, metrics, token, self.digests,
                                  fingerprint=self.fingerprint, evict=self._evict)

    # ---- this pod's identity -------------------------------------------------------------------
    def start_digest(self) -> asyncio.Future[str]:
        """Start hashing the model now (idempotent); restores and saves await the same task."""
        if self._digest is not None and self._digest.done() and self._digest.exception() is not None:
            self._digest = None  # the model file was missing or unreadable: try again on the next call
        if self._digest is None:
            if self.settings.model_sha256:
                self._digest = asyncio.get_running_loop().create_future()
                self._digest.set_result(self.settings.model_sha256.lower())
            else:
                cache = self.store.root / ".model-digest.json"
                self._digest = asyncio.ensure_future(files.model_digest(self.settings.model_file, cache))
        return self._digest

    def digest_ready(self) -> bool:
        task = self.start_digest()
        return task.done() and task.exception() is None

    async def _server_props(self) -> tuple[str, int | None]:
        """llama-server's build and per-slot context, read once (`/props`): a restarted server runs the
        pod's same image and command line, so the same build and context."""
        if self._server is None:
            try:
                props = await self.llama.props()
            except LlamaError as exc:
                raise Refused("llama", f"llama-server is not answering /props: {exc}", 503) from exc
            n_ctx = props.get("default_generation_settings", {}).get("n_ctx")
            self._server = (str(props.get("build_info", "")), int(n_ctx) if n_ctx else None)
        return self._server

    async def slot_context(self) -> int | None:
        """Tokens each slot really holds (llama-server caps it at the model's training context); None
        while the server does not answer."""
        try:
            return (await self._server_props())[1]
        except Refused:
            return None

    async def fingerprint(self) -> Fingerprint:
        digest = await self.start_digest()
        build, n_ctx = await self._server_props()
        s = self.settings
        return Fingerprint(
            model_sha256=digest, build=build, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
            flash_attn=s.flash_attn, kv_unified=s.kv_unified, n_slots=s.slots, swa_full=s.swa_full,
            attn_rot_disabled=s.attn_rot_disabled, n_ctx_slot=n_ctx,
        )

    # ---- save -----------------------------------------------------------------------------------
    async def save(
        self, slot: int, name: str, *, pinned: bool = False, blocks: list[str] | None = None,
        block_chars: int = 0, tokens: list[int] | None = None, n_chars: int = 0, text_hash: str = "",
    ) -> SnapshotManifest:
        final = self.store.bin_path(name)
        fingerprint = await self.fingerprint()
        tmp = self.store.temp_path("save")
        try:
            try:
                result = await self.llama.save_slot(slot, tmp.name)
            except LlamaError as exc:
                raise _llama_refusal("save", exc) from exc
            try:
                sha, size = await sha256_file(tmp)
            except FileNotFoundError as exc:
                raise Refused("config", "llama-server saved elsewhere: its --slot-save-path must be the "
                                        "agent's snapshot folder", 500) from exc
            saved = await asyncio.to_thread(read_state_tokens, tmp)
            if len(saved) != int(result.get("n_saved", -1)):
                said = result.get("n_saved")
                raise Refused("tokens", f"file holds {len(saved)} tokens, server said {said}")
            if tokens is not None and tokens != saved:
                raise Refused("tokens", "the slot holds other tokens than the request names")
            self._evict(size, name)
            os.replace(tmp, final)
            self.digests.remember(final, file_version(final), sha, size)
        finally:
            tmp.unlink(missing_ok=True)
        manifest = SnapshotManifest(
            name=name, fingerprint=fingerprint, n_tokens=len(saved),
            tokens_sha256=tokens_sha256(saved),
            blocks=list(blocks or []), block_chars=block_chars if blocks else 0,
            n_chars=n_chars, text_hash=text_hash, model=self.settings.model_name, size=size, sha256=sha,
            pinned=pinned,
            source_pod=self.settings.pod_name,
        )
        signed = self.store.write_manifest(manifest)
        self.metrics.bytes.labels("saved").inc(size)
        return signed

    # ---- pull -----------------------------------------------------------------------------------
    async def pull(self, name: str, source: str, *, pinned: bool | None = None) -> SnapshotManifest:
        """Fetch and verify snapshot `name` from the peer agent at `source` (`pull.py`)."""
        return await self._puller.pull(name, source, pinned=pinned)

    # ---- restore --------------------------------------------------------------------------------
    async def restore(self, name: str, slot: int) -> RestoreResult:
        started = time.perf_counter()
        path = self.store.bin_path(name)
        with self.store.in_use(name):
            manifest = self.store.read_manifest(name)
            mismatch = fingerprint_mismatch(manifest.fingerprint, fingerprint := await self.fingerprint())
            if mismatch:
                raise Refused("fingerprint", f"snapshot {name} does not fit this pod: {mismatch}")
            if fingerprint.n_ctx_slot is not None and manifest.n_tokens > fingerprint.n_ctx_slot:
                raise Refused("context", f"{manifest.n_tokens} tokens exceed the slot context "
                                         f"{fingerprint.n_ctx_slot}")
            try:
                sha, size = await self.digests.sha256(path)
            except SymlinkRefused as exc:
                raise Refused("symlink", f"snapshot file {name}.bin is a symlink") from exc
            except FileNotFoundError as exc:
                raise Refused("not_found", f"snapshot file {name}.bin is missing", 404) from exc
            if size != manifest.size:
                self.store.discard(name, "size")
                raise Refused("size", f"file has {size} bytes, manifest says {manifest.size}")
            if sha != manifest.sha256:
                self.store.discard(name, "checksum")
                raise Refused("checksum", f"sha256 of {name}.bin differs from its manifest")
            verified = time.perf_counter()
            try:
                result = await self.llama.restore_slot(slot, path.name)
            except LlamaError as exc:
                raise _llama_refusal("restore", exc) from exc
            n_restored = int(result.get("n_restored", -1))
            n_read = result.get("n_read")  # bytes the server read: the verified file's size, or not it
            if n_restored != manifest.n_tokens or (n_read is not None and int(n_read) != manifest.size):
                with contextlib.suppress(LlamaError):
                    await self.llama.erase_slot(slot)  # never leave unexpected tokens in a slot
                self.store.discard(name, "restore")
                raise Refused("restore", f"server restored {n_restored} tokens ({n_read} bytes), manifest "
                                         f"says {manifest.n_tokens} ({manifest.size} bytes)", 502)
            self.store.touch(name)
        done = time.perf_counter()
        return RestoreResult(
            name=name, slot=slot, n_tokens=n_restored, verify_ms=(verified - started) * 1000,
            restore_ms=float(result.get("timings", {}).get("restore_ms", 0.0)),
            total_ms=(done - started) * 1000,
        )

    def _evict(self, incoming: int, keep: str) -> None:
        for manifest in self.store.evict_for(incoming, frozenset({keep}) | self.required):
            self.metrics.evictions.labels(str(manifest.pinned).lower()).inc()

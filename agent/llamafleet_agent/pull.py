"""Pulling a snapshot from a peer agent: every check that stands between a peer's bytes and this folder.

- The peer's address must be `http(s)://<IP literal in peer_networks>:<port>` (`llamafleet_core.networks`):
  the agent presents its token there, so a caller cannot send it to a metadata service, the API server
  by name, or a URL with a path of its choosing.
- The peer's manifest must be signed with the agents' key (`llamafleet_core.snapshot_signing`): a peer
  that is not an agent of this namespace, or a llama-server container that rewrote a manifest, cannot
  make this pod hold KV under another text's name. The manifest is read with a size cap.
- A foreign fingerprint, or a size over this pod's budget, is refused before downloading.
- The budget is charged with the bytes actually received, never with the peer's `size`: room is made
  for at most twice what arrived so far, so a lying peer evicts about what it sent, not the store.
- The file lands under a dot-temp name and is renamed only once its size, sha256 and token hash match.

What went wrong with a peer is logged here; the caller learns a kind (`peer`, 404 when the peer does not
hold the snapshot), never the peer's status or body: a pull is not a probe of the pod network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from llamafleet_agent import files
from llamafleet_agent.files import Digests, file_version, read_state_tokens, sha256_file
from llamafleet_agent.metrics import AgentMetrics
from llamafleet_agent.settings import AgentSettings
from llamafleet_agent.store import Refused, SnapshotStore
from llamafleet_core.networks import parse_networks, peer_base_url
from llamafleet_core.snapshot import Fingerprint, SnapshotManifest, fingerprint_mismatch, tokens_sha256

log = logging.getLogger(__name__)


class PeerPuller:
    def __init__(
        self, settings: AgentSettings, store: SnapshotStore, http: httpx.AsyncClient, metrics: AgentMetrics,
        token: str, digests: Digests, *, fingerprint: Callable[[], Awaitable[Fingerprint]],
        evict: Callable[[int, str], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.http = http
        self.metrics = metrics
        self._token = token
        self._peers = parse_networks(settings.peer_networks)
        self.digests = digests
        self._fingerprint = fingerprint
        self._evict = evict

    async def pull(self, name: str, source: str, *, pinned: bool | None = None) -> SnapshotManifest:
        self.store.check_name(name)
        try:
            base = peer_base_url(source, self._peers)
        except ValueError as exc:
            raise Refused("source", f"refused pull source: {exc}", 400) from exc
        headers = {"Authorization": f"Bearer {self._token}"}
        remote = await self._peer_manifest(base, name, headers)
        if not self.store.signed(remote):
            self.metrics.untrusted.labels("peer").inc()
            log.warning("peer manifest not signed by an agent", extra={"snapshot": name, "peer": base})
            raise Refused("signature", f"the peer's manifest of {name} is not signed by an agent", 502)
        if remote.size > self.store.budget_bytes:
            raise Refused("budget", f"snapshot {name} is larger than this pod's snapshot budget", 413)
        mismatch = fingerprint_mismatch(remote.fingerprint, await self._fingerprint())
        if mismatch:
            raise Refused("fingerprint", f"snapshot {name} does not fit this pod: {mismatch}")
        with contextlib.suppress(Refused):
            local = self.store.read_manifest(name)
            if local.sha256 == remote.sha256 and self.store.bin_path(name).is_file():
                self.store.touch(name)  # already here and verified when it arrived
                return local
        tmp = self.store.temp_path("pull")
        try:
            await self._download(base, name, headers, tmp, remote)
            self._evict(remote.size, name)  # verified: now it may take its whole place
            final = self.store.bin_path(name)
            os.replace(tmp, final)
            self.digests.remember(final, file_version(final), remote.sha256, remote.size)
        finally:
            tmp.unlink(missing_ok=True)
        manifest = remote.model_copy(update={"pinned": remote.pinned if pinned is None else pinned})
        signed = self.store.write_manifest(manifest)
        self.metrics.bytes.labels("pulled").inc(remote.size)
        return signed

    def _peer_failed(self, name: str, base: str, what: str, status: int = 502) -> Refused:
        """The refusal for anything a peer did wrong: details in this agent's log, a kind for the caller."""
        log.warning("pull from a peer failed", extra={"snapshot": name, "peer": base, "detail": what[:300]})
        return Refused("peer", f"the peer did not serve snapshot {name}", status)

    async def _peer_manifest(self, base: str, name: str, headers: dict[str, str]) -> SnapshotManifest:
        limit = self.settings.max_body_bytes  # a manifest is a few KB: never buffer a peer's whole body
        try:
            async with self.http.stream("GET", f"{base}/v1/snapshots/{name}", headers=headers,
                                        timeout=30.0) as resp:
                if resp.status_code != 200:
                    # 404 is the one status passed on: "the peer does not hold it" drops no index entry.
                    status = 404 if resp.status_code == 404 else 502
                    what = f"answered {resp.status_code} for the manifest"
                    raise self._peer_failed(name, base, what, status)
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise self._peer_failed(name, base, f"manifest over {limit} bytes")
        except httpx.HTTPError as exc:
            raise self._peer_failed(name, base, f"unreachable: {type(exc).__name__}: {exc}") from exc
        try:
            remote = SnapshotManifest.model_validate_json(bytes(body))
        except ValueError as exc:
            raise self._peer_failed(name, base, "invalid manifest") from exc
        if remote.name != name:
            raise self._peer_failed(name, base, f"sent the manifest of {remote.name[:80]!r}")
        return remote

    async def _download(self, base: str, name: str, headers: dict[str, str], tmp: Path,
                        want: SnapshotManifest) -> None:
        """Stream the peer's file into `tmp`, then check size, sha256 and the token list it holds.

        The budget is charged with what arrived, never with what the peer claims: room is made for at
        most twice the bytes received so far (doubling keeps the evictions to a few per file), so a
        peer that lies about `size` and then sends less evicts at most about what it sent."""
        room = 0
        try:
            async with self.http.stream("GET", f"{base}/v1/snapshots/{name}/file", headers=headers,
                                        timeout=60.0) as resp:
                if resp.status_code != 200:
                    raise self._peer_failed(name, base, f"answered {resp.status_code} for the file")
                written = 0
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    async for chunk in resp.aiter_bytes(files.CHUNK):
                        written += len(chunk)
                        if written > want.size:
                            raise Refused("size", f"peer sent more than the manifest's {want.size} bytes")
                        if written > room:
                            room = min(want.size, 2 * written)
                            self._evict(room, name)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except httpx.HTTPError as exc:
            raise self._peer_failed(name, base, f"transfer failed: {type(exc).__name__}: {exc}") from exc
        sha, size = await sha256_file(tmp)
        if size != want.size:
            raise Refused("size", f"received {size} bytes, manifest says {want.size}")
        if sha != want.sha256:
            raise Refused("checksum", "sha256 of the received file differs from the manifest")
        try:
            got = await asyncio.to_thread(read_state_tokens, tmp)
        except ValueError as exc:
            raise Refused("tokens", f"received file is not a slot file: {exc}") from exc
        if len(got) != want.n_tokens or tokens_sha256(got) != want.tokens_sha256:
            raise Refused("tokens", "the file's tokens differ from the manifest's token hash")

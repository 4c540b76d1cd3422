"""Restore-on-miss: get a snapshot into the leased slot before the request is forwarded pinned to it.

    snapshot on another pod -> the target pod's agent pulls it from the peer's agent (it verifies
    size, sha256, token hash and fingerprint, and renames only a verified file)
    -> the target pod's agent restores it into the slot (fingerprint and checksum checked again)

Every failure (agent down, refusal, bad checksum, peer gone mid-transfer, an invalid name in the index)
returns a `RestoreFailure`; the caller then forwards as COMPUTE. Nothing here raises to the request.
Snapshots the agents call bad or gone lose their index entry so no other request tries them again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.snapshot import valid_snapshot_name
from llamafleet_core.types import Endpoint, SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots.base import BAD_SNAPSHOT_KINDS, SnapshotMetrics, failure_kind

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreFailure:
    op: str  # pull or restore
    kind: str  # the agent's failure kind (bounded), e.g. checksum, fingerprint, peer, auth
    reason: str  # for logs


@dataclass(frozen=True, slots=True)
class Restored:
    snapshot: SnapshotRef  # as it now exists on the target pod
    n_tokens: int
    pulled: bool
    seconds: float


class RestoreExecutor:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, token: str | Callable[[str], str],
        metrics: SnapshotMetrics,
        tasks: TaskSet, speeds: SpeedBook | None = None,
    ) -> None:
        self._http = http
        self._index = index
        self._token = token
        self._metrics = metrics
        self._tasks = tasks
        self._speeds = speeds

    def agent(self, url: str) -> AgentClient:
        """A client for the agent at `url`, with that agent's own token (`token` may be a function of the
        URL: per-namespace tokens, see agent_tokens.py)."""
        token = self._token(url) if callable(self._token) else self._token
        return AgentClient(url, self._http, token)

    async def restore(
        self, model: str, blocks: Sequence[str], target: Endpoint, slot: int, snap: SnapshotRef,
        agents: Mapping[str, str],
    ) -> Restored | RestoreFailure:
        """Pull `snap` onto `target` if it lives elsewhere, then restore it into `slot`.

        `blocks` is the request's chain (the snapshot's chain is a prefix of it); `agents` maps pod uids
        to agent URLs (any pod discovery knows, ready or not: an agent may outlive its server)."""
        started = time.perf_counter()
        remote = snap.pod_uid != target.uid
        source = "peer" if remote else "local"
        if target.agent_url is None:
            return self._failed(source, "restore", "no_agent", "the target pod has no agent", snap, model)
        if not valid_snapshot_name(snap.name):
            # Never hand the agents a name from the index that could be a path; the agent refuses it too.
            return self._failed(source, "restore", "name", "invalid snapshot name in the index", snap, model)
        here = self.agent(target.agent_url)
        local = snap
        if remote:
            peer_url = agents.get(snap.pod_uid)
            if peer_url is None:
                return self._failed(source, "pull", "no_peer_agent", "the snapshot's pod has no known agent",
                                    snap, model)
            try:
                local = await self.pull(snap, target.uid, target.agent_url, peer_url)
            except AgentError as exc:
                return self._failed(source, "pull", failure_kind(exc.kind, exc.status), exc.reason, snap,
                                    model)
        pulled = time.perf_counter()
        try:
            result = await here.restore(snap.name, slot)
        except AgentError as exc:
            return self._failed(source, "restore", failure_kind(exc.kind, exc.status), exc.reason, local,
                                model)
        seconds = time.perf_counter() - started
        if self._speeds is not None:  # what the cost model learns of this pod's restores and pulls
            size, pull_s = local.size_bytes, pulled - started
            self._speeds.observe_restore(target.uid, size_bytes=size, seconds=seconds - pull_s)
            if remote:
                self._speeds.observe_restore(target.uid, size_bytes=size, seconds=pull_s, pull=True)
        self._metrics.restores.labels(source, "ok").inc()
        self._metrics.restore_seconds.labels(source).observe(seconds)
        if remote:
            # The target now has the file too: later requests restore it there without a pull.
            self._tasks.spawn(self.record(model, local, blocks[: snap.n_blocks]), name="record-pulled")
        log.info("snapshot restored", extra={
            "snapshot": snap.name, "pod": target.url, "slot": slot, "source": source,
            "n_tokens": result.n_tokens, "restore_ms": round(result.restore_ms, 2),
            "seconds": round(seconds, 4),
        })
        return Restored(local, result.n_tokens, remote, seconds)

    def _failed(
        self, source: str, op: str, kind: str, reason: str, snap: SnapshotRef, model: str
    ) -> RestoreFailure:
        self._metrics.restores.labels(source, "failed").inc()
        self._metrics.failures.labels(op, kind).inc()
        log.warning("snapshot not restored; computing instead", extra={
            "snapshot": snap.name[:80], "op": op, "kind": kind, "reason": reason[:300],
        })
        local_fit = kind == "fingerprint" and op == "restore"  # its own pod cannot use it any more
        if kind in BAD_SNAPSHOT_KINDS or local_fit:
            self._tasks.spawn(self._forget(model, snap), name="forget-snapshot")
        return RestoreFailure(op, kind, reason)

    async def pull(self, snap: SnapshotRef, uid: str, agent_url: str, peer_url: str) -> SnapshotRef:
        """Have the agent at `agent_url` (pod `uid`) fetch and verify `snap` from the agent at
        `peer_url`; the copy as it now exists there. Raises AgentError."""
        manifest = await self.agent(agent_url).pull(snap.name, peer_url)
        return replace(snap, pod_uid=uid, size_bytes=manifest.size, n_tokens=manifest.n_tokens)

    async def record(self, model: str, snap: SnapshotRef, blocks: Sequence[str]) -> bool:
        """Record a pulled copy in the index; False (logged) when the index refused it: the file is
        there, and the pod's next resync records it."""
        try:
            await self._index.record_snapshot(model, snap, blocks)
        except Exception as exc:
            log.warning("recording a pulled snapshot failed", extra={"error": str(exc)})
            return False
        return True

    async def _forget(self, model: str, snap: SnapshotRef) -> None:
        try:
            await self._index.forget_snapshot(model, snap.name, snap.pod_uid)
        except Exception as exc:
            log.warning("forgetting a bad snapshot failed", extra={"error": str(exc)})

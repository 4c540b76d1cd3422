"""Ship the snapshots first sight saves to the model's other pods, in the background.

First sight saves a shared head (tools and system prompt, `fs-`) and its stages (`st-`, `dv-`) on the
pod whose slot built them. A later session of that head on another pod then chooses between pulling
the snapshot from the peer on its request path (a round trip between agents, the file, its checksum:
~70 ms for a 2.5K-token head here) and restoring a local stage and computing the rest of the head
again (30-40 tokens: cheaper in time). Computing wins on time, so every such session computed the
workspace and date lines of its head once more: on the 50-session mixed workload, 27 of 78 requests,
~40 tokens each, a fifth of all the tokens computed.

A snapshot first sight saved is shared material by construction (its cut is where sessions part), so
each is copied to every other pod serving the model as soon as it is saved, off every request path,
one copy at a time per gateway, and recorded there in the index: the next session of that head
restores it locally in milliseconds. The agents verify each copy (checksum, fingerprint at restore);
a failed copy is counted and left to the request path, which can still pull it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.types import SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.snapshots.base import SnapshotMetrics, failure_kind

log = logging.getLogger(__name__)

_REMEMBERED = 4096  # (snapshot, pod) copies made or under way that are not started again

#: The model's pods that can take a copy, now: pod uid -> agent URL (the source pod included).
Peers = Callable[[str], Mapping[str, str]]


class Shipper:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, token: str, metrics: SnapshotMetrics,
        tasks: TaskSet, peers: Peers,
    ) -> None:
        self._http = http
        self._index = index
        self._token = token
        self._metrics = metrics
        self._tasks = tasks
        self._peers = peers
        self._one_at_a_time = asyncio.Semaphore(1)  # copies never crowd the pulls requests wait for
        self._started: set[tuple[str, str]] = set()

    def ship(self, model: str, ref: SnapshotRef, blocks: Sequence[str]) -> None:
        """Start copying `ref` (just saved and recorded) to every other pod of `model`."""
        peers = self._peers(model)
        source = peers.get(ref.pod_uid)
        if source is None:
            return
        for uid, agent_url in peers.items():
            key = (ref.name, uid)
            if uid == ref.pod_uid or key in self._started:
                continue
            if len(self._started) >= _REMEMBERED:
                self._started.clear()  # at worst a copy is made twice; the agent replaces it atomically
            self._started.add(key)
            self._tasks.spawn(self._copy(model, ref, list(blocks), uid, agent_url, source),
                              name="ship-snapshot")

    async def _copy(self, model: str, ref: SnapshotRef, blocks: list[str], uid: str, agent_url: str,
                    source: str) -> None:
        async with self._one_at_a_time:
            try:
                manifest = await AgentClient(agent_url, self._http, self._token).pull(ref.name, source)
            except AgentError as exc:
                self._started.discard((ref.name, uid))
                self._metrics.ships.labels("failed").inc()
                self._metrics.failures.labels("ship", failure_kind(exc.kind, exc.status)).inc()
                log.info("snapshot not shipped",
                         extra={"snapshot": ref.name[:80], "reason": exc.reason[:300]})
                return
        local = replace(ref, pod_uid=uid, size_bytes=manifest.size, n_tokens=manifest.n_tokens)
        try:
            await self._index.record_snapshot(model, local, blocks)
        except Exception as exc:  # the file is there; the pod's next resync records it
            log.warning("recording a shipped snapshot failed", extra={"error": str(exc)})
            return
        self._metrics.ships.labels("ok").inc()
        log.info("snapshot shipped", extra={"snapshot": ref.name, "pod": agent_url, "bytes": manifest.size})

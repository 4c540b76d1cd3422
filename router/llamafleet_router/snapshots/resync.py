"""After a restart: record a pod's snapshot files in the index again.

A restarted pod gets a new epoch and discovery purges its index entries (fencing), but its agent still
has the snapshot files on disk. The first time this router sees a pod at a given epoch (a restart, or
this router's own start), it lists the agent's snapshots and records those whose manifest still fits the
pod (same fingerprint) and whose name carries their exact identity (`cuts.ref_from_manifest`). So the
first session of a later day restores instead of computing.

The gateway lists a pod as soon as discovery reports it at a new epoch (`keep_synced`, every
`resync_interval_s`), so a later day's first session does not pay for the listing and its records
(docs/design.md, "Measurements behind the rules"). A request that sees the pod before that waits for
the listing (bounded by `resync_timeout_s`; one listing per pod and epoch, shared), so that very
request can restore already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.snapshot import fingerprint_mismatch
from llamafleet_core.types import Endpoint
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics, failure_kind
from llamafleet_router.snapshots.cuts import ref_from_manifest

log = logging.getLogger(__name__)


class Resync:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, config: SnapshotConfig,
        metrics: SnapshotMetrics,
    ) -> None:
        self._http = http
        self._index = index
        self._config = config
        self._metrics = metrics
        self._synced: dict[str, int] = {}  # pod uid -> epoch whose snapshots were recorded
        self._running: dict[tuple[str, int], asyncio.Task[int]] = {}

    def forget_all(self) -> None:
        """Record every pod's snapshots again at the next request (the index lost its entries)."""
        self._synced.clear()

    def pending(self, pods: Sequence[PodStatus]) -> list[Endpoint]:
        return [
            p.endpoint for p in pods
            if p.ready and p.endpoint.agent_url is not None and p.model
            and self._synced.get(p.endpoint.uid) != p.endpoint.pod.epoch
        ]

    async def ensure(self, pods: Sequence[PodStatus]) -> None:
        """Record the snapshots of every pod not yet synced at its current epoch; never raises."""
        todo = self.pending(pods)
        if not todo:
            return
        tasks = [self._task(ep) for ep in todo]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, timeout=self._config.resync_timeout_s)

    def _task(self, ep: Endpoint) -> asyncio.Task[int]:
        key = (ep.uid, ep.pod.epoch)
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(self._sync(ep))
            self._running[key] = task
            task.add_done_callback(lambda _t: self._running.pop(key, None))
        return task

    async def _sync(self, ep: Endpoint) -> int:
        assert ep.agent_url is not None
        agent = AgentClient(ep.agent_url, self._http, self._config.agent_token(ep.agent_url))
        recorded = 0
        try:
            fingerprint = await agent.fingerprint()
            manifests = await agent.list()
            records = []
            for manifest in manifests:
                if fingerprint_mismatch(manifest.fingerprint, fingerprint) is not None:
                    continue
                ref = ref_from_manifest(manifest, ep.uid, self._config.block_chars)
                if ref is not None:
                    records.append(self._index.record_snapshot(ep.model, ref, manifest.blocks))
            # At once: a request may be waiting for this listing, and each record is a Redis round trip.
            results = await asyncio.gather(*records, return_exceptions=True)
            recorded = sum(not isinstance(r, BaseException) for r in results)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
        except AgentError as exc:
            self._metrics.failures.labels("resync", failure_kind(exc.kind, exc.status)).inc()
            log.warning("could not list a pod's snapshots", extra={"pod": ep.url, "reason": exc.reason[:300]})
        except Exception as exc:  # the index is down: a hint lost, retried at the next epoch
            self._metrics.failures.labels("resync", "index").inc()
            log.warning("could not record a pod's snapshots", extra={"pod": ep.url, "error": str(exc)})
        # Marked done even on failure: the index is a hint, and a failing agent must not slow every request.
        self._synced[ep.uid] = ep.pod.epoch
        self._metrics.resynced.inc(recorded)
        if recorded:
            log.info("snapshots recorded again",
                     extra={"pod": ep.url, "epoch": ep.pod.epoch, "count": recorded})
        return recorded


async def keep_synced(
    resync: Callable[[], Resync | None], endpoints: Callable[[], Awaitable[Sequence[PodStatus]]],
    interval_s: float,
) -> None:
    """Run `Resync.ensure` over discovery's pods every `interval_s`, until cancelled; never raises.
    `resync` gives the flow's Resync once the flow exists (the lifespan builds it with the director)."""
    while True:
        current = resync()
        if current is not None:
            try:
                await current.ensure(await endpoints())
            except Exception:  # discovery failing now says nothing about the next round
                log.exception("background snapshot resync failed")
        await asyncio.sleep(interval_s)

"""Copy a snapshot to a pod whose sessions want it, in the background.

First sight saves a shared head (tools and system prompt, `fs-`) and its stages (`st-`, `dv-`) on the
pod whose slot built them. A later session of that head on another pod chooses between pulling the
snapshot from the peer on its request path (a round trip between agents, the file, its checksum) and
restoring a local stage and computing the rest of the head again (tens of tokens: usually cheaper in
time). Computing wins on time, so every such session would compute the workspace and date lines of its
head once more (docs/design.md, "A snapshot a pod's session wanted is copied there", for the figures).

So when the action choice sees a snapshot on another pod that would have given its pod more than
what it uses (`action.wanted_here`), the flow has that pod's agent pull it now, off the request path,
one copy at a time per gateway, and records the copy in the index: the next session of that prefix on
that pod restores it locally in milliseconds. Copies are made on demand, not of every snapshot to
every pod: a pod's disk holds what its own sessions use, and a burst of sessions arriving with a new
prefix stays on the pod that just built it (a copy at once to the idle pod draws the burst's next
session there, and pods that share a machine's cores then slow each other's sessions). The agents
verify each copy (checksum; fingerprint at restore); a failed copy is counted and left to the request
path, which can still pull it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from llamafleet_core.agent_client import AgentError
from llamafleet_core.types import Endpoint, SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.snapshots.base import SnapshotMetrics, failure_kind
from llamafleet_router.snapshots.restore import RestoreExecutor

log = logging.getLogger(__name__)

# (snapshot, pod) copies made, under way or failed, not started again: a failed copy is left to the
# request path (which can still pull it), so that a dead peer does not draw a copy attempt per request.
_REMEMBERED = 4096


class Shipper:
    """Background copies, made with the restore path's own pull and record (`RestoreExecutor`)."""

    def __init__(self, *, restorer: RestoreExecutor, metrics: SnapshotMetrics, tasks: TaskSet) -> None:
        self._restorer = restorer
        self._metrics = metrics
        self._tasks = tasks
        self._one_at_a_time = asyncio.Semaphore(1)  # copies never crowd the pulls requests wait for
        self._started: set[tuple[str, str]] = set()

    def ship(self, model: str, ref: SnapshotRef, blocks: Sequence[str], target: Endpoint,
             agents: Mapping[str, str]) -> None:
        """Start copying `ref` to `target` (pod uid -> agent URL in `agents` names its source), unless
        a copy there is already made, under way or failed."""
        source, key = agents.get(ref.pod_uid), (ref.name, target.uid)
        if (source is None or target.agent_url is None or not target.restores or target.uid == ref.pod_uid
                or key in self._started):
            return
        if len(self._started) >= _REMEMBERED:
            self._started.clear()  # at worst a copy is made twice; the agent replaces it atomically
        self._started.add(key)
        self._tasks.spawn(self._copy(model, ref, list(blocks), target.uid, target.agent_url, source),
                          name="ship-snapshot")

    async def _copy(self, model: str, ref: SnapshotRef, blocks: list[str], uid: str, agent_url: str,
                    source: str) -> None:
        async with self._one_at_a_time:
            try:
                local = await self._restorer.pull(ref, uid, agent_url, source)
            except AgentError as exc:
                self._metrics.ships.labels("failed").inc()
                self._metrics.failures.labels("ship", failure_kind(exc.kind, exc.status)).inc()
                log.info("snapshot not shipped",
                         extra={"snapshot": ref.name[:80], "reason": exc.reason[:300]})
                return
        if await self._restorer.record(model, local, blocks):
            self._metrics.ships.labels("ok").inc()
            log.info("snapshot shipped", extra={"snapshot": ref.name, "pod": uid, "bytes": local.size_bytes})

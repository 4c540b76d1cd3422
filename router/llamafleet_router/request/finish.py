"""The end of one forwarded response: give back what the request held, count it, log it, and hand the
rest (the index record, then the lease) to the background.

`Finisher` is the proxy's `on_finish`: called exactly once, synchronously, however the response ended
(proxy/forward.py says why synchronously). It gives back the key's in-flight permit and the slot claim,
whose lease goes only after the after-response record (request/claim.py says why in that order).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llamafleet_router.access.limits import Permit
from llamafleet_router.background import TaskSet
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.request.after import AfterResponse
from llamafleet_router.request.claim import SlotClaim
from llamafleet_router.request.clock import RequestClock
from llamafleet_router.scheduling.framework import SchedRequest
from llamafleet_router.snapshots import SnapshotFlow

log = logging.getLogger(__name__)


async def _close_upstream(close: Callable[[], Awaitable[None]]) -> None:
    try:
        await close()
    except Exception:
        log.debug("closing the upstream response failed", exc_info=True)


@dataclass
class Finisher:
    """What one forwarded request gives back when its response ends."""

    req: SchedRequest
    claim: SlotClaim
    key: str
    after: AfterResponse
    metrics: RouterMetrics
    tasks: TaskSet
    snapshots: SnapshotFlow | None
    permit: Permit | None = None  # the key's place in its in-flight limit
    clock: RequestClock | None = None  # the client-side timings, from the arrival
    started: float = field(default_factory=time.perf_counter)
    armed: bool = True

    def disarm(self) -> None:
        """Nothing was forwarded after all (the pod refused the connection): the attempt's claim is
        released by the director, the permit stays with the request for its next attempt."""
        self.armed = False

    def __call__(self, outcome: Outcome, close: Callable[[], Awaitable[None]] | None) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.permit is not None:
            self.permit.release()
        req, decision = self.req, self.claim.decision
        self.claim.release(first=self.after.finished(req, decision, outcome))
        if close is not None:
            self.tasks.spawn(_close_upstream(close), name="close-upstream")
        if self.snapshots is not None:
            self.snapshots.request_answering(req.request_id)  # ended without answering, maybe
        self.metrics.requests.labels(req.model, self.key, str(outcome.status)).inc()
        if self.clock is not None:
            self.clock.finished(req.model, self.key, outcome)
        if outcome.error:
            self.metrics.stream_errors.inc()
        if outcome.disconnected:
            self.metrics.client_disconnects.inc()
        stats = outcome.stats
        log.info("request finished", extra={
            "model": req.model, "key": self.key, "status": outcome.status, "pod": decision.endpoint.url,
            "slot": decision.slot, "action": decision.action.value, "branch": decision.branch,
            "predicted_blocks": decision.predicted_blocks,
            "cache_n": stats.cache_n if stats else None, "prompt_n": stats.prompt_n if stats else None,
            "disconnected": outcome.disconnected, "error": outcome.error,
            "seconds": round(time.perf_counter() - self.started, 4),
        })

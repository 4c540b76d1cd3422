"""`queue-depth` scorer: prefer pods with fewer waiting requests.

Type: `queue-depth`
Parameters: none.
Consumes: `EndpointState.queue_depth` (requests deferred on the pod).
Score: `1 / (1 + queue_depth)`: 1 with an empty queue, halving at one waiting request. A `PodLocalScorer`:
the scheduler asks it once per view of a pod (`score_pod`), not per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import (
    Candidate,
    CycleState,
    EndpointState,
    NoParamsPlugin,
    PluginParams,
    PluginSpec,
    SchedRequest,
)


class QueueDepthScorer(NoParamsPlugin):
    type_name: ClassVar[str] = "queue-depth"

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        return {c.key: _queue(c.state) for c in candidates}

    def score_pods(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> dict[str, float]:
        return {e.endpoint.pod.uid: _queue(e) for e in endpoints}

    def score_pod(self, endpoint: EndpointState) -> float:
        return _queue(endpoint)


def _queue(e: EndpointState) -> float:
    return 1.0 / (1.0 + max(e.queue_depth, 0))


SPEC = PluginSpec(
    type_name=QueueDepthScorer.type_name, kind="scorer", params=PluginParams, factory=QueueDepthScorer.create
)

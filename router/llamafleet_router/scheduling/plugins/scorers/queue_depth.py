"""`queue-depth` scorer: prefer pods with fewer waiting requests.

Type: `queue-depth`
Parameters: none.
Consumes: `EndpointState.queue_depth` (requests deferred on the pod).
Score: `1 / (1 + queue_depth)`: 1 with an empty queue, halving at one waiting request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import (
    Candidate,
    CycleState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)


class QueueDepthScorer:
    type_name: ClassVar[str] = "queue-depth"

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> QueueDepthScorer:
        PluginParams.model_validate(params)
        return cls(name)

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        return {c.key: 1.0 / (1.0 + max(c.state.queue_depth, 0)) for c in candidates}


SPEC = PluginSpec(
    type_name=QueueDepthScorer.type_name, kind="scorer", params=PluginParams, factory=QueueDepthScorer.create
)

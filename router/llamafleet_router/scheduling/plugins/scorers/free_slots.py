"""`free-slots` scorer: prefer pods with more idle slots.

Type: `free-slots`
Parameters: none.
Consumes: `EndpointState.busy_slots`, `Endpoint.n_slots`.
Score: `idle_slots / n_slots` of the candidate's pod (the same for every slot of a pod); 0 when
`n_slots` is 0. A light weight spreads cold prefixes without overriding a prefix hit. A `PodLocalScorer`:
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


class FreeSlotsScorer(NoParamsPlugin):
    type_name: ClassVar[str] = "free-slots"

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        return {c.key: _free(c.state) for c in candidates}

    def score_pods(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> dict[str, float]:
        return {e.endpoint.pod.uid: _free(e) for e in endpoints}

    def score_pod(self, endpoint: EndpointState) -> float:
        return _free(endpoint)


def _free(e: EndpointState) -> float:
    n = e.endpoint.n_slots
    return len(e.idle_slots) / n if n > 0 else 0.0


SPEC = PluginSpec(
    type_name=FreeSlotsScorer.type_name, kind="scorer", params=PluginParams, factory=FreeSlotsScorer.create
)

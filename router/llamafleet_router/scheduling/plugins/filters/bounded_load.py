"""`bounded-load` filter: drop endpoints loaded well above the fleet mean (KubeAI CHWBL style).

Type: `bounded-load`
Parameters:
  - `load_factor` (float > 1, default 1.25): an endpoint is overloaded when its load exceeds
    `load_factor * (total_load + 1) / n_endpoints`. The `+ 1` counts the request being placed, so an idle
    fleet never looks overloaded (KubeAI's formula).
  - `exempt_idle` (bool, default true): an endpoint with an idle slot is never dropped.
Consumes: `EndpointState.in_flight + queue_depth` (the load) and `busy_slots`.
Produces: nothing. Never empties a non-empty list: if every endpoint would be dropped, all are kept.

Why `exempt_idle`: llama-server runs a request on an idle slot at once, so a pod with a free slot is not
overloaded however many requests it holds, and steering away from it only throws away the prefix it
holds (the project wants fewer pods per prefix, each serving more sessions). The guard matters when
requests queue: it stops prefix affinity from piling a queue onto one hot pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from llamafleet_router.scheduling.framework import (
    CycleState,
    EndpointState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)


class BoundedLoadParams(PluginParams):
    load_factor: float = Field(default=1.25, gt=1.0)
    exempt_idle: bool = True


def load_threshold(endpoints: Sequence[EndpointState], load_factor: float) -> float:
    """The most load an endpoint may carry before it counts as overloaded."""
    total = sum(e.load for e in endpoints)
    return load_factor * (total + 1) / max(len(endpoints), 1)


class BoundedLoadFilter:
    type_name: ClassVar[str] = "bounded-load"

    def __init__(self, name: str, params: BoundedLoadParams) -> None:
        self.name = name
        self.params = params

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> BoundedLoadFilter:
        return cls(name, BoundedLoadParams.model_validate(params))

    def filter(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState]:
        limit = load_threshold(endpoints, self.params.load_factor)
        kept = [e for e in endpoints if e.load <= limit or (self.params.exempt_idle and e.idle_slots)]
        return kept if kept else list(endpoints)


SPEC = PluginSpec(
    type_name=BoundedLoadFilter.type_name,
    kind="filter",
    params=BoundedLoadParams,
    factory=BoundedLoadFilter.create,
)

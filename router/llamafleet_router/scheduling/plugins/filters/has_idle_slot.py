"""`has-idle-slot` filter: prefer endpoints with at least one idle slot.

Type: `has-idle-slot`
Parameters: none.
Consumes: `EndpointState.busy_slots` and `Endpoint.n_slots`.
Produces: nothing.

When every endpoint is full it keeps them all: the request then queues on a pod (llama-server defers a
task until a slot frees), which is still better than refusing it. Never empties a non-empty list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from llamafleet_router.scheduling.framework import (
    CycleState,
    EndpointState,
    NoParamsPlugin,
    PluginParams,
    PluginSpec,
    SchedRequest,
)


class HasIdleSlotFilter(NoParamsPlugin):
    type_name: ClassVar[str] = "has-idle-slot"

    def filter(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState]:
        idle = [e for e in endpoints if e.idle_slots]
        return idle if idle else list(endpoints)


SPEC = PluginSpec(
    type_name=HasIdleSlotFilter.type_name,
    kind="filter",
    params=PluginParams,
    factory=HasIdleSlotFilter.create,
)

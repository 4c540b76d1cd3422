"""`healthy` filter: drop endpoints that are unhealthy or not ready.

Type: `healthy`
Parameters: none.
Consumes: `EndpointState.healthy` (discovery's probes) and `Endpoint.ready` (e.g. a pod still warming
its SharedPrefix snapshots is not ready).
Produces: nothing. May return an empty list: then nothing can serve the request.
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


class HealthyFilter(NoParamsPlugin):
    type_name: ClassVar[str] = "healthy"

    def filter(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState]:
        return [e for e in endpoints if e.healthy and e.endpoint.ready]


SPEC = PluginSpec(
    type_name=HealthyFilter.type_name, kind="filter", params=PluginParams, factory=HealthyFilter.create
)

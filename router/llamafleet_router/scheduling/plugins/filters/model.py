"""`model` filter: keep endpoints serving the requested model.

Type: `model`
Parameters: none.
Consumes: `SchedRequest.model` and `Endpoint.model`.
Produces: nothing. May return an empty list (an unknown model): the API answers with an error.
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


class ModelFilter(NoParamsPlugin):
    type_name: ClassVar[str] = "model"

    def filter(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState]:
        return [e for e in endpoints if e.endpoint.model == req.model]


SPEC = PluginSpec(
    type_name=ModelFilter.type_name, kind="filter", params=PluginParams, factory=ModelFilter.create
)

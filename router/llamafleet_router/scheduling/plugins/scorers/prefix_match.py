"""`prefix-match` scorer: how much of the prompt the slot already holds.

Type: `prefix-match`
Parameters: none.
Consumes: `lookup` (from `prefix-lookup`).
Score: `held / total` where `total = len(prompt.blocks)` and `held` is the leading blocks this slot holds
(on a --slot-attach build, what any slot of the pod holds, since the pod shares it). 0 for an empty
prompt or an empty lookup (index down: the degraded hash takes over).

A candidate on a pod where another (busy) slot holds more gets only its own slot's share here; the
path of restoring a snapshot into it is scored by `snapshot-match`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llamafleet_core.types import Lookup, SlotRef
from llamafleet_router.scheduling.framework import (
    LOOKUP,
    Candidate,
    CycleState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)
from llamafleet_router.scheduling.lookup_view import held_blocks


class PrefixMatchScorer:
    type_name: ClassVar[str] = "prefix-match"

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> PrefixMatchScorer:
        PluginParams.model_validate(params)
        return cls(name)

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        total = len(req.prompt.blocks)
        lookup = state.read(LOOKUP, Lookup())
        if total == 0 or not lookup.slots:
            return {c.key: 0.0 for c in candidates}
        return {c.key: min(held_blocks(lookup, c.endpoint, c.slot), total) / total for c in candidates}


SPEC = PluginSpec(
    type_name=PrefixMatchScorer.type_name,
    kind="scorer",
    params=PluginParams,
    factory=PrefixMatchScorer.create,
    consumes=(LOOKUP.name,),
)

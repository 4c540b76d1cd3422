"""`prefix-match` scorer: how much of the prompt the slot already holds.

Type: `prefix-match`
Parameters: none.
Consumes: `lookup` (from `prefix-lookup`).
Score: `held / total` where `total = len(prompt.blocks)` and `held` is the leading blocks this slot holds
(on a --slot-attach build, what any slot of the pod holds, since the pod shares it; on a --cache-prefix
build, at least the head the pod keeps as a RAM entry, which the server loads into the slot), counted as
`lookup_view.resumable` on pods whose model resumes only at checkpoints; a slot the index says holds
this head exactly (`Lookup.exact_head`) scores its head's characters, a little above a slot holding
the same whole blocks that may part from the head inside its last one. 0 for an empty
prompt or an empty lookup (index down: the degraded hash takes over); a `GatedScorer`, skipped then.

A candidate on a pod where another (busy) slot holds more gets only its own slot's share here; the
path of restoring a snapshot into it is scored by `snapshot-match`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import (
    LOOKUP,
    NO_LOOKUP,
    Candidate,
    CycleState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)
from llamafleet_router.scheduling.lookup_view import (
    attached_blocks,
    held_chars,
    holds_exact_head,
    pod_best_blocks,
    ram_blocks,
    resumable,
)

# Blocks a slot of a --slot-attach pod scores less when what it reuses comes from another slot's cells:
# less than one block, so it only breaks a tie with the slot holding them
ATTACH_TIE = 0.5


class PrefixMatchScorer:
    type_name: ClassVar[str] = "prefix-match"

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> PrefixMatchScorer:
        PluginParams.model_validate(params)
        return cls(name)

    def applies(self, req: SchedRequest, state: CycleState) -> bool:
        return bool(req.prompt.blocks) and bool(state.read(LOOKUP, NO_LOOKUP).slots)

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        total = len(req.prompt.blocks)
        lookup = state.read(LOOKUP, NO_LOOKUP)
        if total == 0 or not lookup.slots:
            return {c.key: 0.0 for c in candidates}
        slots = lookup.slots
        exact_head, total_chars = lookup.exact_head, total * req.prompt.block_chars
        pod_best: dict[str, int] = {}  # --slot-attach pods: computed once per pod, not per candidate
        pod_ram: dict[str, int] = {}  # --cache-prefix pods: the same
        out: dict[SlotRef, float] = {}
        for c in candidates:
            tie = 0.0
            own = slots.get(c.key, 0)
            if c.endpoint.attach:
                uid = c.endpoint.pod.uid
                best = pod_best.get(uid)
                if best is None:
                    best = pod_best[uid] = max(pod_best_blocks(lookup, uid), ram_blocks(lookup, c.endpoint))
                held = attached_blocks(own, best, c.endpoint, req.prompt)
                # Ties go to the slot holding it: attaching elsewhere gives the same tokens but replaces
                # that slot's own content, which its session may want next
                tie = ATTACH_TIE if held > own else 0.0
            elif c.endpoint.cache_prefix:
                uid = c.endpoint.pod.uid
                ram = pod_ram.get(uid)
                if ram is None:
                    ram = pod_ram[uid] = ram_blocks(lookup, c.endpoint)
                held = max(own, ram)
            else:
                held = own  # held_blocks without building a SlotRef
            exact = c.key in exact_head or (c.endpoint.cache_prefix and
                                            holds_exact_head(lookup, c.endpoint, c.slot, held))
            if not c.endpoint.resume_anywhere:
                held = resumable(held, c.endpoint, req.prompt, own=exact or c.key == lookup.conversation)
            score = max(0.0, min(held, total) - tie) / total
            if exact:  # it holds the head's last, partial block too: above a slot that parts inside it
                score = min(1.0, held_chars(lookup, c.endpoint, c.slot, req.prompt, held) / total_chars)
            out[c.key] = score
        return out


SPEC = PluginSpec(
    type_name=PrefixMatchScorer.type_name,
    kind="scorer",
    params=PluginParams,
    factory=PrefixMatchScorer.create,
    consumes=(LOOKUP.name,),
)

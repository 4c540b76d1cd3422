"""`snapshot-match` scorer: how much of the prompt a snapshot restore would give this slot.

Type: `snapshot-match`
Parameters:
  - `local_discount` (float in [0, 1], default 0.9): multiplier for a snapshot on the candidate's own pod;
    a restore costs a little (milliseconds), so an equal match already in a slot scores higher.
  - `remote_discount` (float in [0, 1], default 0.7): multiplier for a snapshot on another pod, which the
    candidate pod's agent must pull first (needs `Endpoint.agent_url`).
Consumes: `lookup` (from `prefix-lookup`) and `restore_enabled` (set by the scheduler from the config's
`decision.restore_enabled`; 0 everywhere when false).
Score: `max(discount * (snapshot_blocks - held) / total)` over snapshots restorable into the candidate
that cover strictly more blocks than the slot already gives (`held`, as `prefix-match` counts it); 0
if none. The gain, not the snapshot's whole size: `prefix-match` already scores what the slot holds,
and a slot holding part of the prompt plus a restore then scored above one holding more of it. On a
model that resumes only at checkpoints, where such partial holdings are counted short, that sent a
conversation's next turn to a slot holding another session (restore, then compute its history again)
instead of its own slot. Restorable: the candidate's pod has an
agent and the prompt strictly extends the snapshot's exact text (`action.usable_snapshots`, the rule
the action choice applies too, so a scored snapshot is one that may really be restored). Whether the
restore is actually worth it is decided after the pick by the action rule (`action.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from llamafleet_core.types import Lookup, SlotRef
from llamafleet_router.scheduling.action import extends_strictly
from llamafleet_router.scheduling.framework import (
    LOOKUP,
    NO_LOOKUP,
    RESTORE_ENABLED,
    Candidate,
    CycleState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)
from llamafleet_router.scheduling.lookup_view import held_blocks, restorable_snapshots


class SnapshotMatchParams(PluginParams):
    local_discount: float = Field(default=0.9, ge=0.0, le=1.0)
    remote_discount: float = Field(default=0.7, ge=0.0, le=1.0)


class SnapshotMatchScorer:
    type_name: ClassVar[str] = "snapshot-match"

    def __init__(self, name: str, params: SnapshotMatchParams) -> None:
        self.name = name
        self.params = params

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> SnapshotMatchScorer:
        return cls(name, SnapshotMatchParams.model_validate(params))

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        total = len(req.prompt.blocks)
        lookup = state.read(LOOKUP, NO_LOOKUP)
        if total == 0 or not lookup.snapshots or not state.read(RESTORE_ENABLED, True):
            return {c.key: 0.0 for c in candidates}
        # The exact-text check hashes up to the whole prompt: once per snapshot, not per candidate.
        usable = Lookup(lookup.slots, tuple(s for s in lookup.snapshots if extends_strictly(req.prompt, s)))
        return {c.key: self._one(c, usable, req, total) for c in candidates}

    def _one(self, c: Candidate, lookup: Lookup, req: SchedRequest, total: int) -> float:
        if c.endpoint.agent_url is None:
            return 0.0
        held = held_blocks(lookup, c.endpoint, c.slot, req.prompt)
        best = 0.0
        for snap, remote in restorable_snapshots(lookup, c.endpoint):
            if snap.n_blocks <= held:
                continue
            discount = self.params.remote_discount if remote else self.params.local_discount
            best = max(best, discount * (min(snap.n_blocks, total) - held) / total)
        return best


SPEC = PluginSpec(
    type_name=SnapshotMatchScorer.type_name,
    kind="scorer",
    params=SnapshotMatchParams,
    factory=SnapshotMatchScorer.create,
    consumes=(LOOKUP.name,),
)

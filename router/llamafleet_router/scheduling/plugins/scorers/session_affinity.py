"""`session-affinity` scorer: send a session's next turn back to where its last turn ran.

Type: `session-affinity`
Parameters:
  - `max_sessions` (int, default 100000): bound of the LRU map session_id -> (pod uid, slot).
  - `pod_score` (float in [0, 1], default 0.5): score of another slot on the session's last pod.
Consumes: `SchedRequest.session_id`; its own map, updated by `on_decision` after every decision; and
`lookup` (when a `prefix-lookup` runs): without a session id, the session is the conversation, and its
last slot is the one the index tags with the prompt's conversation (`Lookup.conversation`, shared by
every replica).
Nominates the session's last slot, so the scheduler scores it even when the index does not name it,
and is a `GatedScorer`: skipped for a request without a known session.
Score: 1.0 for the slot that last served this session, `pod_score` for other slots of that pod, 0
otherwise (and 0 everywhere without a session).

It matters most when the index cannot help (Redis down, or a conversation's tail not yet recorded): the
previous turn's slot holds the whole conversation so far. The map is per router replica and in memory;
that is fine because the prefix index, not this map, is the shared truth.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import (
    LOOKUP,
    NO_LOOKUP,
    Candidate,
    CycleState,
    Decision,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)


class SessionAffinityParams(PluginParams):
    max_sessions: int = Field(default=100_000, ge=1)
    pod_score: float = Field(default=0.5, ge=0.0, le=1.0)


class SessionAffinityScorer:
    type_name: ClassVar[str] = "session-affinity"

    def __init__(self, name: str, params: SessionAffinityParams) -> None:
        self.name = name
        self.params = params
        self._last: OrderedDict[str, SlotRef] = OrderedDict()

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> SessionAffinityScorer:
        return cls(name, SessionAffinityParams.model_validate(params))

    def last_slot(self, session_id: str) -> SlotRef | None:
        """Where this session last went (without refreshing its LRU position)."""
        return self._last.get(session_id)

    def _session_slot(self, req: SchedRequest, state: CycleState) -> SlotRef | None:
        if req.session_id is not None:
            return self._last.get(req.session_id)
        return state.read(LOOKUP, NO_LOOKUP).conversation

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        last = self._session_slot(req, state)
        if last is None:
            return {c.key: 0.0 for c in candidates}
        out: dict[SlotRef, float] = {}
        for c in candidates:
            if c.key == last:
                out[c.key] = 1.0
            elif c.state.uid == last.pod_uid:
                out[c.key] = self.params.pod_score
            else:
                out[c.key] = 0.0
        return out

    def applies(self, req: SchedRequest, state: CycleState) -> bool:
        return self._session_slot(req, state) is not None

    def nominate(self, req: SchedRequest, state: CycleState) -> Iterable[SlotRef]:
        """The session's last slot: it may hold the whole conversation without the index knowing."""
        last = self._session_slot(req, state)
        return () if last is None else (last,)

    def on_decision(self, req: SchedRequest, decision: Decision) -> None:
        if req.session_id is None:
            return
        self._last[req.session_id] = decision.slot_ref
        self._last.move_to_end(req.session_id)
        while len(self._last) > self.params.max_sessions:
            self._last.popitem(last=False)


SPEC = PluginSpec(
    type_name=SessionAffinityScorer.type_name,
    kind="scorer",
    params=SessionAffinityParams,
    factory=SessionAffinityScorer.create,
)

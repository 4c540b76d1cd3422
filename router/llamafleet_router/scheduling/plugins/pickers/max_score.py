"""`max-score` picker: rank candidates by weighted total, best first.

Type: `max-score`
Parameters:
  - `tie_break` ("order" or "random", default "order"): how equal totals are ordered.
    "order" sorts ties by pod uid, then within a pod the slot this router released longest ago first
    (`EndpointState.slot_last_used`: overwriting it loses the least recent conversation; never used
    first), then slot id: reproducible, and replicas agree on the pod, which keeps sessions of one
    prefix together when scores carry no signal. The slot candidates stand for their groups the same
    way (`candidates.py`). "random" shuffles ties with a
    `random.Random(seed)` owned by the plugin: spreads identical cold requests, reproducible per seed.
  - `seed` (int or null, default null): seed for "random"; null seeds from the OS.
Consumes: the scored candidates (weighted totals computed by the scheduler).
Produces: the full ranked list, so the scheduler can move on to the next slot when a lease fails.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from llamafleet_router.scheduling.framework import (
    Candidate,
    CycleState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
    ScoredCandidate,
)


class MaxScoreParams(PluginParams):
    tie_break: Literal["order", "random"] = "order"
    seed: int | None = None


class MaxScorePicker:
    type_name: ClassVar[str] = "max-score"

    def __init__(self, name: str, params: MaxScoreParams) -> None:
        self.name = name
        self.params = params
        self._rng = random.Random(params.seed)

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> MaxScorePicker:
        return cls(name, MaxScoreParams.model_validate(params))

    def pick(
        self, req: SchedRequest, state: CycleState, scored: Sequence[ScoredCandidate]
    ) -> list[ScoredCandidate]:
        # Rounding makes totals that differ only by float summation order count as equal.
        if self.params.tie_break == "random":
            ordered = sorted(scored, key=lambda s: (s.candidate.key.pod_uid, s.candidate.slot))
            jitter = [self._rng.random() for _ in ordered]
            ranked = sorted(zip(ordered, jitter, strict=True), key=lambda p: (-round(p[0].total, 9), p[1]))
            return [s for s, _ in ranked]
        return sorted(scored, key=lambda s: self._order(s.total, s.candidate))

    @property
    def orders_ties_by_pod(self) -> bool:
        """`OrderedPicker`: true for `tie_break: order` (`_order`: total, then pod uid)."""
        return self.params.tie_break == "order"

    @staticmethod
    def _order(total: float, c: Candidate) -> tuple[float, str, int, int]:
        return -round(total, 9), c.key.pod_uid, c.state.released_at(c.slot), c.slot


SPEC = PluginSpec(
    type_name=MaxScorePicker.type_name, kind="picker", params=MaxScoreParams, factory=MaxScorePicker.create
)

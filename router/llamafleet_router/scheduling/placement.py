"""Placement: the slot lease a decision holds, taken on the best ranked slot whose lease is free.

A slot's lease keeps two router replicas from pinning two requests to one slot. Placement walks the
ranked candidates (a candidate whose lease is taken stands for its group's other idle slots, which
score the same: `candidates.with_spares`), at most `leases.max_attempts` tries in all, and hands the
leased slot to the decider. A restore then moves, lease and all, to the pod's idle slot used longest ago
(`candidates.restore_targets`: the picked slot's content would be replaced). The lease store failing
never fails a request: the request goes on unleased, and the TTL frees whatever was taken.

A request that finds no idle slot, or every idle slot's lease taken, is queued (`queued_decision`):
forwarded without a lease to the best ranked pod, to wait there (llama-server defers a task pinned to
a busy slot until that slot frees). It is pinned to the slot holding the most of the prefix, and among
slots holding it alike (a SharedPrefix is in every slot) to the one with the fewest of this router's
requests: pinned to the lowest id, every queued request would wait behind all the others there while
the pod's other slots freed and went to newcomers. A request no slot holds anything for waits for any
slot, unless the session's previous slot won.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from llamafleet_core.types import Action, Lookup, SlotRef
from llamafleet_router.scheduling.action import ActionDecider
from llamafleet_router.scheduling.candidates import Groups, restore_targets, with_spares
from llamafleet_router.scheduling.config import LeaseConfig
from llamafleet_router.scheduling.framework import (
    ANY_SLOT,
    LOOKUP,
    NO_LOOKUP,
    Branch,
    Candidate,
    CycleState,
    Decision,
    EndpointState,
    SchedRequest,
    ScoredCandidate,
    SlotLeasesLike,
)
from llamafleet_router.scheduling.lookup_view import pod_best_slots

log = logging.getLogger(__name__)

_MOVES = 2  # lease attempts when moving a restore to an older slot (another replica may hold them)

#: (point, plugin type, name, started): the scheduler's per-step latency report.
Report = Callable[[str, str, str, float], None]


class Placement:
    def __init__(
        self, leases: SlotLeasesLike | None, config: LeaseConfig, holder_prefix: str,
        decider: ActionDecider, report: Report,
    ) -> None:
        self._leases = leases
        self._config = config
        self._holder_prefix = holder_prefix
        self._decider = decider
        self._report = report

    async def place(
        self, req: SchedRequest, state: CycleState, ranked: Sequence[ScoredCandidate], named: Groups
    ) -> Decision | None:
        """The decision on the best of `ranked` whose lease this replica takes; None when every try
        found the lease held by another replica."""
        holder = f"{self._holder_prefix}:{req.request_id}"
        attempts = self._config.max_attempts
        for sc in ranked:
            for c in with_spares(sc.candidate, named):
                if attempts <= 0:
                    return None
                attempts -= 1
                pick = sc if c is sc.candidate else ScoredCandidate(c, sc.total, sc.scores)
                if self._leases is None:
                    return await self._moved(req, state, pick, self._decider.decide(req, state, pick, None))
                started = time.perf_counter()
                try:
                    ok = await self._leases.acquire(c.key, holder, self._config.ttl_s)
                except Exception as exc:  # lease store down: serve unleased rather than fail
                    log.warning("slot lease store unavailable (%s); proceeding without a lease", exc)
                    return self._decider.decide(req, state, pick, None)
                finally:
                    self._report("lease", "slot-leases", "acquire", started)
                if ok:
                    return await self._moved(req, state, pick, self._decider.decide(req, state, pick, holder))
        return None

    async def _moved(
        self, req: SchedRequest, state: CycleState, pick: ScoredCandidate, decision: Decision
    ) -> Decision:
        """A restore goes into the pod's idle slot used longest ago rather than the picked one, whose
        content it would replace; the lease moves with it."""
        if decision.action is not Action.RESTORE or decision.snapshot is None:
            return decision
        s, holder = pick.candidate.state, decision.lease_holder
        lookup = state.read(LOOKUP, NO_LOOKUP)
        for slot in restore_targets(s, decision.slot, lookup, decision.snapshot.n_blocks)[:_MOVES]:
            if self._leases is not None and holder is not None:
                try:
                    if not await self._leases.acquire(SlotRef(s.uid, slot), holder, self._config.ttl_s):
                        continue  # another replica's: try the next
                except Exception:
                    return decision
                await self.release(decision)
            moved = ScoredCandidate(Candidate(s, slot), pick.total, pick.scores)
            return self._decider.decide(req, state, moved, holder)
        return decision

    async def release(self, decision: Decision) -> None:
        """Release the decision's slot lease, if it took one. Never raises: the TTL is the backstop."""
        if decision.lease_holder is None or self._leases is None:
            return
        try:
            await self._leases.release(decision.slot_ref, decision.lease_holder)
        except Exception as exc:
            log.warning("could not release lease on %s (%s); its TTL will", decision.slot_ref.key(), exc)


def queued_decision(
    req: SchedRequest, lookup: Lookup | None, ranked: Sequence[ScoredCandidate],
    survivors: Sequence[EndpointState], is_session_slot: Callable[[ScoredCandidate], bool],
) -> Decision:
    """Pure: the queued decision over every slot of the surviving pods, `ranked` best first; `lookup`
    is the index's (None: the index did not answer), carried on for the steps after the decision."""
    if not ranked:  # only endpoints reporting zero slots: let the server sort it out
        return Decision(survivors[0].endpoint, ANY_SLOT, Action.DIRECT, None, 0, Branch.QUEUED, lookup=lookup)
    top = ranked[0]
    endpoint = top.candidate.endpoint
    best = pod_best_slots(lookup, endpoint.pod.uid, endpoint.n_slots) if lookup is not None else None
    if best is not None:
        slots, blocks = best
        waiting = top.candidate.state.slot_requests
        slot = min(slots, key=lambda s: (waiting.get(s, 0), s))
        held = min(blocks, len(req.prompt.blocks))
        return Decision(endpoint, slot, Action.DIRECT, None, held, Branch.QUEUED, lookup=lookup)
    slot = top.candidate.slot if is_session_slot(top) else ANY_SLOT
    return Decision(endpoint, slot, Action.DIRECT, None, 0, Branch.QUEUED, lookup=lookup)

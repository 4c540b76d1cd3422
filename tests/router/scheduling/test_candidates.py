"""Scoring only the named slots and one representative per group picks what scoring every slot would."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.types import Action, Lookup
from llamafleet_router.scheduling.candidates import candidates, restore_targets, slot_groups, with_spares
from llamafleet_router.scheduling.config import default_config
from llamafleet_router.scheduling.framework import (
    LOOKUP,
    RESTORE_ENABLED,
    Candidate,
    CycleState,
    Decision,
    EndpointState,
)
from llamafleet_router.scheduling.scheduler import Scheduler

from .fakes import FakeIndex, FakeLeases, request, slot, state
from .test_properties import fleets, lookups

CONFIG = default_config()


@settings(max_examples=150, deadline=None)
@given(
    fleet=fleets(),
    lookup=lookups(),
    down=st.booleans(),
    n_blocks=st.integers(0, 40),
    last=st.none() | st.tuples(st.sampled_from("abcdef"), st.integers(0, 5)),
)
def test_schedule_picks_what_scoring_every_idle_slot_picks(
    fleet: list[EndpointState], lookup: Lookup, down: bool, n_blocks: int, last: tuple[str, int] | None
) -> None:
    """Whatever the index says, whether it is up, and wherever the session last ran, the decision's
    slot is the top of ranking EVERY idle slot with the same scorers and picker (or, for a restore,
    its pod's idle slot released longest ago: `candidates.restore_targets`)."""
    sched = Scheduler(CONFIG, index=FakeIndex(lookup, down=down), leases=FakeLeases(), holder_prefix="r")
    req = request(n_blocks=n_blocks, session_blocks=n_blocks // 2, session_id="s")
    if last is not None:  # the session's previous turn, as session affinity learnt it
        ep = next((s.endpoint for s in fleet if s.endpoint.pod.name == last[0]), fleet[0].endpoint)
        sched.on_decision(req, Decision(ep, last[1], Action.DIRECT, None, 0, "cold"))
    if not any(s.idle_slots for s in fleet):
        return
    # The same inputs the pipeline's scorers saw: the filters keep pods with idle slots here.
    cs = CycleState()
    cs.write(RESTORE_ENABLED, True)
    asyncio.run(sched.producers[0].prepare(req, cs, fleet))
    survivors: list[EndpointState] = list(fleet)
    for f in sched.filters:
        survivors = f.filter(req, cs, survivors)
    every = [Candidate(s, n) for s in survivors for n in s.idle_slots]
    top = sched.rank(req, cs, every)[0].candidate  # before schedule() teaches session affinity
    decision = asyncio.run(sched.schedule(req, fleet))
    assert decision.endpoint.pod.uid == top.key.pod_uid
    if decision.action is Action.RESTORE and decision.slot != top.slot:  # moved to an older idle slot
        assert decision.snapshot is not None
        older = restore_targets(top.state, top.slot, cs.read(LOOKUP, Lookup()), decision.snapshot.n_blocks)
        assert decision.slot == older[0]
    else:
        assert decision.slot == top.slot


def test_one_candidate_per_run_length_and_one_for_the_rest_when_many_slots_match() -> None:
    """32 slots of which 12 hold 9 blocks and 4 hold 3 become 3 candidates: a 9, a 3 and an empty one."""
    pod = state("a", n_slots=32, busy=(0,))
    held = {slot("a", n): 9 for n in range(4, 16)} | {slot("a", n): 3 for n in range(20, 24)}
    got = candidates([pod], slot_groups(Lookup(slots=held), ()), idle_only=True)
    assert [c.slot for c in got] == [4, 20, 1]


def test_nominated_slot_is_its_own_candidate_when_the_index_does_not_name_it() -> None:
    pod = state("a", n_slots=8)
    got = candidates([pod], slot_groups(Lookup(), [slot("a", 5)]), idle_only=True)
    assert [c.slot for c in got] == [5, 0]


def test_spares_follow_the_representative_in_its_group_only() -> None:
    """When a candidate's lease is taken, the next slots tried hold the same run (or nothing), never
    another group's, and a nominated slot has no spares."""
    pod = state("a", n_slots=8, busy=(3,))
    groups = slot_groups(Lookup(slots={slot("a", 1): 4, slot("a", 2): 4, slot("a", 5): 2}), [slot("a", 6)])
    assert [c.slot for c in with_spares(Candidate(pod, 1), groups)] == [1, 2]
    assert [c.slot for c in with_spares(Candidate(pod, 0), groups)] == [0, 4, 7]
    assert [c.slot for c in with_spares(Candidate(pod, 6), groups)] == [6]


async def test_next_slot_of_the_group_is_leased_when_another_replica_holds_the_first() -> None:
    """Another replica holding the representative's lease must not send the request to another pod."""
    leases = FakeLeases(held={slot("a", 0): "other-replica"})
    sched = Scheduler(CONFIG, index=FakeIndex(), leases=leases, holder_prefix="r")
    d = await sched.schedule(request(), [state("a", n_slots=4), state("b", n_slots=4, in_flight=3)])
    assert (d.endpoint.pod.name, d.slot) == ("a", 1)


def test_the_slot_released_longest_ago_stands_for_its_group() -> None:
    """Two slots hold the same run of this prompt (two sessions of one agent, between turns): the one
    released longest ago is offered, so the newer conversation keeps its slot; among the slots holding
    nothing of it, one never used goes first. Spares follow in the same order."""
    pod = state("a", n_slots=6, last_used={0: 9, 1: 4, 3: 7, 4: 2})
    groups = slot_groups(Lookup(slots={slot("a", 0): 5, slot("a", 1): 5}), ())
    assert [c.slot for c in candidates([pod], groups, idle_only=True)] == [1, 2]
    assert [c.slot for c in with_spares(Candidate(pod, 1), groups)] == [1, 0]
    assert [c.slot for c in with_spares(Candidate(pod, 2), groups)] == [2, 5, 4, 3]


def test_in_flight_remembers_when_each_slot_was_released() -> None:
    """The gateway's own bookkeeping feeds `slot_last_used`: later releases get larger numbers, a busy
    slot keeps its previous release, and pods are kept apart."""
    from prometheus_client import CollectorRegistry

    from llamafleet_router.fleet.state import InFlight
    from llamafleet_router.metrics import RouterMetrics

    flight = InFlight(RouterMetrics(CollectorRegistry()))
    for uid, n in [("a", 2), ("a", 0), ("b", 0), ("a", 2)]:
        flight.begin(uid, uid, n)
        flight.end(uid, uid, n)
    used = flight.last_used("a")
    assert set(used) == {0, 2} and used[2] > used[0] and set(flight.last_used("b")) == {0}
    flight.begin("a", "a", 0)
    assert flight.last_used("a") == used  # still busy: not released again yet
    used.clear()
    assert flight.last_used("a")  # a copy: the caller cannot change the bookkeeping


def test_slots_the_index_tags_apart_from_their_run_are_candidates_of_their_own() -> None:
    """Slots 0 and 1 hold the same 30 whole blocks, but the index says slot 1 holds the prompt's head
    exactly (and slot 3 its conversation): they score apart, so they cannot share one representative."""
    pod = state("a", n_slots=4, resume_anywhere=False, last_used={0: 1, 1: 5, 2: 9, 3: 7})
    lookup = Lookup(slots={slot("a", n): 30 for n in range(4)}, exact_head=frozenset({slot("a", 1)}),
                    conversation=slot("a", 3))
    groups = slot_groups(lookup, ())
    got = candidates([pod], groups, idle_only=True)
    assert sorted(c.slot for c in got) == [0, 1, 3]
    assert [c.slot for c in with_spares(next(c for c in got if c.slot == 0), groups)] == [0, 2]

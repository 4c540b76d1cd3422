"""The prefix-lookup producer (the only I/O) and the max-score picker."""

from __future__ import annotations

from llamafleet_core.types import Lookup
from llamafleet_router.scheduling.framework import (
    INDEX_AVAILABLE,
    LOOKUP,
    Candidate,
    CycleState,
    PluginHandle,
    ScoredCandidate,
)
from llamafleet_router.scheduling.plugins.pickers.max_score import MaxScoreParams, MaxScorePicker
from llamafleet_router.scheduling.plugins.producers.prefix_lookup import PrefixLookup

from .fakes import FakeIndex, request, slot, snapshot, state


async def test_prefix_lookup_writes_lookup_once_when_index_answers() -> None:
    """One index call per request with the model and the whole block chain."""
    index = FakeIndex(Lookup(slots={slot("a", 1): 4}))
    producer = PrefixLookup.create("pl", {}, PluginHandle(index=index))
    cs = CycleState()
    req = request(n_blocks=6)
    await producer.prepare(req, cs, [state("a")])
    assert index.calls == [("tiny", req.prompt.blocks)]
    assert cs.read(LOOKUP, Lookup()).slots == {slot("a", 1): 4}
    assert cs.read(INDEX_AVAILABLE, False) is True


async def test_prefix_lookup_drops_hits_on_pods_that_are_not_live() -> None:
    """A stale entry for a dead pod can never attract a request."""
    index = FakeIndex(
        Lookup(slots={slot("a", 1): 4, slot("dead", 0): 9}, snapshots=(snapshot("s", "dead", 9),))
    )
    cs = CycleState()
    await PrefixLookup.create("pl", {}, PluginHandle(index=index)).prepare(request(), cs, [state("a")])
    assert cs.read(LOOKUP, Lookup()) == Lookup(slots={slot("a", 1): 4})


async def test_prefix_lookup_degrades_instead_of_raising_when_index_is_down() -> None:
    index = FakeIndex(down=True)
    cs = CycleState()
    await PrefixLookup.create("pl", {}, PluginHandle(index=index)).prepare(request(), cs, [state("a")])
    assert cs.read(INDEX_AVAILABLE, True) is False
    assert cs.read(LOOKUP, Lookup(slots={slot("x", 0): 1})) == Lookup()


async def test_prefix_lookup_degrades_when_index_is_slower_than_timeout() -> None:
    """A hung Redis must not hold the request: past timeout_s the index counts as down."""
    index = FakeIndex(Lookup(slots={slot("a", 0): 3}), delay_s=0.5)
    cs = CycleState()
    await PrefixLookup.create("pl", {"timeout_s": 0.02}, PluginHandle(index=index)).prepare(
        request(), cs, [state("a")]
    )
    assert cs.read(INDEX_AVAILABLE, True) is False


def scored(totals: dict[tuple[str, int], float]) -> list[ScoredCandidate]:
    states = {name: state(name) for name, _ in totals}
    return [ScoredCandidate(Candidate(states[n], s), t) for (n, s), t in totals.items()]


def order(ranked: list[ScoredCandidate]) -> list[tuple[str, int]]:
    return [(r.candidate.endpoint.pod.name, r.candidate.slot) for r in ranked]


def test_max_score_ranks_by_total_with_ties_in_pod_slot_order() -> None:
    """Highest first; equal totals ordered by (pod uid, slot), whatever the input order."""
    items = scored({("b", 1): 0.5, ("a", 3): 0.5, ("c", 0): 0.9, ("a", 1): 0.5, ("d", 0): 0.1})
    ranked = MaxScorePicker("ms", MaxScoreParams()).pick(request(), CycleState(), items)
    assert order(ranked) == [("c", 0), ("a", 1), ("a", 3), ("b", 1), ("d", 0)]
    assert order(MaxScorePicker("ms", MaxScoreParams()).pick(request(), CycleState(), items[::-1])) == order(
        ranked
    )


def test_max_score_random_ties_are_reproducible_per_seed_and_keep_score_order() -> None:
    """Seeded shuffling only reorders equal totals, and the same seed gives the same order."""
    items = scored({(n, s): 0.5 for n in "abcd" for s in range(4)} | {("e", 0): 0.9})
    first = MaxScorePicker("ms", MaxScoreParams(tie_break="random", seed=7)).pick(
        request(), CycleState(), items
    )
    again = MaxScorePicker("ms", MaxScoreParams(tie_break="random", seed=7)).pick(
        request(), CycleState(), items
    )
    other = MaxScorePicker("ms", MaxScoreParams(tie_break="random", seed=8)).pick(
        request(), CycleState(), items
    )
    assert order(first)[0] == ("e", 0)
    assert order(first) == order(again)
    assert order(first) != order(other)
    assert sorted(order(first)) == sorted(order(items))

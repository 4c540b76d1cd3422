"""Of candidates the slot-level scorers score alike, only the best few are weighed and ranked
(`weighing.best_alike`): the first `keep` of the ranking, all that placement tries, are those of
ranking every candidate, over fleets where one prefix is held on most pods and totals tie."""

from __future__ import annotations

import random
from typing import Any

import pytest

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.types import PromptTags, SlotRef
from llamafleet_router.scheduling import scheduler as scheduler_module
from llamafleet_router.scheduling.framework import Candidate, EndpointState, SchedRequest
from llamafleet_router.scheduling.plugins.pickers.max_score import MaxScoreParams, MaxScorePicker
from llamafleet_router.scheduling.weighing import best_alike, weigh_candidates
from tests.router.scheduling.fakes import BLOCK_CHARS, MODEL, chain, endpoint, prompt
from tests.router.scheduling.test_prune_unknown import SLOTS, fleet, outcome, scheduler


def _ranking(candidates: list[Candidate], pod_level: Any, slot_level: Any) -> list[SlotRef]:
    picker = MaxScorePicker("max", MaxScoreParams())
    scored = weigh_candidates(candidates, pod_level, slot_level, {})
    return [sc.candidate.key for sc in picker.pick(None, None, scored)]  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(30))
def test_the_first_keep_of_the_ranking_are_those_of_every_candidate(seed: int) -> None:
    """Few distinct slot-level scores, pod-level totals drawn from a few values and nudged below the
    pickers' rounding (ties the pod uid then breaks)."""
    rng = random.Random(seed)
    states = [EndpointState(endpoint(f"p{p:03d}", n_slots=4)) for p in range(80)]
    candidates = [Candidate(s, slot) for s in states for slot in rng.sample(range(4), rng.randrange(1, 4))]
    pod_scores = {s.uid: rng.choice((0.0, 0.25, 0.5, 1.0)) + rng.choice((0.0, 0.0, 1e-10, -1e-10))
                  for s in states}
    pod_level = [("free", 1.0, pod_scores), ("queue", 0.5, {s.uid: rng.choice((0.0, 1.0)) for s in states})]
    prefix = {c.key: rng.choice((0.0, 0.5, 0.5, 1.0)) for c in candidates}
    affinity = {c.key: 1.0 for c in rng.sample(candidates, 3)}
    slot_level = [("prefix", 10.0, prefix), ("affinity", 3.0, affinity)]
    keep = rng.choice((1, 2, 3, 5))
    kept = best_alike(candidates, pod_level, slot_level, keep)
    assert len(kept) < len(candidates)
    assert _ranking(kept, pod_level, slot_level)[:keep] == _ranking(candidates, pod_level, slot_level)[:keep]


def test_of_pods_that_tie_only_the_first_by_uid_are_kept() -> None:
    """Idle pods alike (the usual case at fleet scale): the uid decides, so `keep` candidates remain,
    here two pods, one with two slots (both kept: the picker orders a pod's slots by its own rule)."""
    states = [EndpointState(endpoint(f"p{p:03d}", n_slots=4)) for p in range(200)]
    candidates = [Candidate(s, 1) for s in reversed(states)] + [Candidate(states[1], 3)]
    pod_level = [("free", 1.0, dict.fromkeys((s.uid for s in states), 1.0))]
    kept = best_alike(candidates, pod_level, [("prefix", 10.0, {})], 3)
    assert sorted((c.key.pod_uid, c.slot) for c in kept) == [
        ("uid-p000", 1), ("uid-p001", 1), ("uid-p001", 3)]


def test_few_candidates_are_all_kept() -> None:
    states = [EndpointState(endpoint(f"p{p}", n_slots=2)) for p in range(2)]
    candidates = [Candidate(s, 0) for s in states]
    assert best_alike(candidates, [], [], 3) == candidates


async def _held_widely(rng: random.Random, index: InMemoryPrefixIndex, states: list[EndpointState]) -> None:
    """The prompt's head on most pods, in two or three lengths (a popular agent prefix)."""
    lengths = rng.sample(range(4, 12), 3)
    for s in rng.sample(states, 45):
        for slot in rng.sample(range(SLOTS), rng.randrange(1, 3)):
            n = rng.choice(lengths)
            await index.record_slot(MODEL, SlotRef(s.uid, slot), chain("q", n), n * 64,
                                    PromptTags("head-q", 4, f"conv-{rng.randrange(3)}"))


@pytest.mark.parametrize("seed", range(30))
async def test_decisions_on_a_widely_held_prefix_equal_those_of_weighing_every_candidate(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    states = fleet(rng)
    index = InMemoryPrefixIndex()
    await _held_widely(rng, index, states)
    taken = [SlotRef(s.uid, slot) for s in rng.sample(states, 25) for slot in range(SLOTS)]
    identity = prompt(MODEL, chain("q", 14), session_prefix_chars=8 * BLOCK_CHARS,
                      shared_chars=4 * BLOCK_CHARS, head_tag="head-q", conversation_tag=f"conv-{seed % 3}")
    weighed: list[int] = []
    weigh = scheduler_module.weigh_candidates
    monkeypatch.setattr(scheduler_module, "weigh_candidates",
                        lambda cands, *rest: weighed.append(len(cands)) or weigh(cands, *rest))
    decided, counts = [], []
    for prune in (True, False):
        leases = InMemorySlotLeases()
        for ref in taken:  # another replica holds these: placement moves down the ranking
            await leases.acquire(ref, "other", 60)
        weighed.clear()
        req = SchedRequest(f"r{seed}", MODEL, identity, session_id=None)
        decided.append(outcome(await scheduler(index, leases, prune=prune).schedule(req, states)))
        counts.append(sum(weighed))
    assert decided[0] == decided[1]
    assert counts[0] < counts[1] / 2  # the pruned scheduler weighed far fewer candidates

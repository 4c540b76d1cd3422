"""The candidates a picker of fixed order could place (scheduling/pruning.py): of each bucket of slots
that score alike, only its contenders are built, checked against building every candidate and counting
what is surely ranked before each; the pods singled out get all their candidates."""

from __future__ import annotations

import random

import pytest

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.types import Lookup, PromptTags, SlotRef, SnapshotRef
from llamafleet_router.scheduling.candidates import (
    SHARING_KINDS,
    Groups,
    candidates,
    pod_kind,
    singled_pods,
    slot_groups,
)
from llamafleet_router.scheduling.framework import Candidate, EndpointState, SchedRequest
from llamafleet_router.scheduling.plugins.scorers.free_slots import FreeSlotsScorer
from llamafleet_router.scheduling.plugins.scorers.queue_depth import QueueDepthScorer
from llamafleet_router.scheduling.pod_rows import PodRow, PodRows
from llamafleet_router.scheduling.pruning import contenders, pruned_candidates
from llamafleet_router.scheduling.weighing import TIE
from tests.router.scheduling.fakes import BLOCK_CHARS, MODEL, chain, endpoint, prompt
from tests.router.scheduling.test_prune_unknown import SLOTS, fleet, outcome, scheduler


def _surely_behind(m: PodRow, pods: list[PodRow], keep: int) -> bool:
    """At least `keep` of `pods` rank surely before `m`: a total more than TIE higher, or the same
    total and a smaller uid (the definition, counted one by one)."""
    ahead = [o for o in pods if o.uid != m.uid
             and (o.total > m.total + TIE or (o.total == m.total and o.uid < m.uid))]
    return len(ahead) >= keep


def _row(state: EndpointState, total: float) -> PodRow:
    return PodRow(state, state.uid, pod_kind(state.endpoint), (total,), total, (-total, state.uid))


@pytest.mark.parametrize("seed", range(40))
def test_contenders_are_the_pods_fewer_than_keep_are_surely_ranked_before(seed: int) -> None:
    """Totals from a few values, some nudged by less than TIE (a picker's rounding may order those
    either way) and some exactly equal (the uid decides)."""
    rng = random.Random(seed)
    pods = [_row(EndpointState(endpoint(f"p{p:03d}", n_slots=2)),
                 rng.choice((0.0, 0.5, 0.75, 1.0)) + rng.choice((0.0, 0.0, 0.0, 3e-9, -3e-9)))
            for p in rng.sample(range(500), rng.randrange(1, 60))]
    keep = rng.choice((1, 2, 3, 5))
    found = contenders(pods, keep)
    assert sorted(r.uid for r in found) == sorted(r.uid for r in pods if not _surely_behind(r, pods, keep))


def test_of_pods_whose_totals_tie_only_the_first_by_uid_contend() -> None:
    """An idle fleet: the pod uid decides, so `keep` pods remain of hundreds."""
    pods = [_row(EndpointState(endpoint(f"p{p:03d}", n_slots=4)), 1.0) for p in reversed(range(300))]
    assert [r.uid for r in contenders(pods, 3)] == ["uid-p000", "uid-p001", "uid-p002"]


def _groups(rng: random.Random, states: list[EndpointState], held: int = 45) -> tuple[Groups, set[str]]:
    """A prompt held on `held` pods in two run lengths, some slots holding its head exactly; a snapshot
    on one pod, a conversation's slot on another."""
    head = (8, 12)
    lookup = Lookup(
        slots={SlotRef(s.uid, slot): rng.choice(head) for s in rng.sample(states, held)
               for slot in rng.sample(range(SLOTS), rng.randrange(1, 3))},
        snapshots=(SnapshotRef("fs-a", states[0].uid, 8, 512, 1000),),
        conversation=SlotRef(states[1].uid, 2))
    exact = frozenset(ref for ref in lookup.slots if rng.random() < 0.3)
    lookup = Lookup(lookup.slots, lookup.snapshots, conversation=lookup.conversation, exact_head=exact)
    nominated = [SlotRef(states[2].uid, 3)]
    return slot_groups(lookup, nominated), singled_pods(lookup, nominated)


def _bucket(c: Candidate, groups: Groups) -> tuple[int, int | None]:
    return pod_kind(c.endpoint), groups.get(c.key.pod_uid, {}).get(c.slot)


class _Nudged:
    """A pod-local score of a few values, some nudged by less than TIE (pickers may order those either
    way), drawn per pod: the totals that make contenders reach past the best few."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def score_pod(self, endpoint: EndpointState) -> float:
        rng = random.Random(f"{self.seed}-{endpoint.uid}")
        return rng.choice((0.25, 0.5, 0.75)) + rng.choice((0.0, 0.0, 3e-9, -3e-9))


@pytest.mark.parametrize("ranked", [False, True], ids=["listed", "ranked"])
@pytest.mark.parametrize("idle_only", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_each_bucket_yields_the_candidates_of_its_contenders_and_singled_pods_yield_all(
        seed: int, idle_only: bool, ranked: bool) -> None:
    """Against every candidate (`candidates`): those of pods singled out, or named and whose slots share
    what the pod holds, all; and of the others, per (pod kind, group), the same candidates as the
    contenders among all of them by the rows' totals. `ranked`: the pods nothing is known about are read
    from the rows' ranking, which holds rows of pods the request does not have too (another model's, a
    pod a filter dropped, views seen before)."""
    rng = random.Random(seed)
    states = fleet(rng)
    groups, singled = _groups(rng, states, held=rng.choice((0, 5, 45)))  # with few, the unknown pods lead
    endpoints = [s for s in states if s.endpoint.model == MODEL and (s.idle_slots or not idle_only)]
    book = PodRows([(FreeSlotsScorer("free"), "free-slots", "free", 1.0),
                    (_Nudged(seed), "nudged", "nudged", 1.0),  # type: ignore[list-item]
                    (QueueDepthScorer("queue"), "queue-depth", "queue", 0.5)])
    if ranked:
        book.refresh(states)
        endpoints = [s for s in endpoints if rng.random() > 0.2]  # those the filters keep
    rows = book.refresh(endpoints)
    total = {row.uid: row.total for row in rows}
    keep = rng.choice((1, 2, 3))
    found = pruned_candidates(rows, groups, singled, keep, idle_only=idle_only,
                              ranking=(book, MODEL) if ranked else None)
    every = candidates(endpoints, groups, idle_only=idle_only)
    assert len(found) == len({c.key for c in found}) and len(found) < len(every)

    def whole(c: Candidate) -> bool:
        uid = c.key.pod_uid  # a sharing pod the lookup does not name scores by its kind alone
        return uid in singled or (uid in groups and bool(pod_kind(c.endpoint) & SHARING_KINDS))

    assert {c.key for c in found if whole(c)} == {c.key for c in every if whole(c)}
    buckets: dict[tuple[int, int | None], list[Candidate]] = {}
    for c in every:
        if not whole(c):
            buckets.setdefault(_bucket(c, groups), []).append(c)
    assert {_bucket(c, groups) for c in found if not whole(c)} == set(buckets)
    for bucket, members in buckets.items():
        pods = [_row(c.state, total[c.key.pod_uid]) for c in members]
        expected = {c.key for c, row in zip(members, pods, strict=True)
                    if not _surely_behind(row, pods, keep)}
        assert {c.key for c in found if not whole(c) and _bucket(c, groups) == bucket} == expected


async def test_a_prefix_held_on_hundreds_of_pods_scores_a_few_of_them_and_decides_alike() -> None:
    """A popular agent head held in one slot of each of 300 idle pods of one kind (the 99th percentile
    of the 1,000-pod simulation): the pruned scheduler scores two buckets' contenders, not 600 slots,
    and decides exactly as scoring every slot does."""
    states = [EndpointState(endpoint(f"p{p:03d}", n_slots=SLOTS), slot_last_used={1: p}) for p in range(300)]
    index = InMemoryPrefixIndex()
    for s in states:
        await index.record_slot(MODEL, SlotRef(s.uid, 1), chain("q", 8), 8 * 64,
                                PromptTags("head-q", 4, f"conv-{s.uid}"))
    identity = prompt(MODEL, chain("q", 14), session_prefix_chars=8 * BLOCK_CHARS,
                      shared_chars=4 * BLOCK_CHARS, head_tag="head-q", conversation_tag="conv-new")
    decided, scored = [], []
    for prune in (True, False):
        sched = scheduler(index, InMemorySlotLeases(), prune=prune)
        prefix = next(s for s, _ in sched.scorers if s.name == "prefix")
        seen: list[int] = []
        score = prefix.score
        prefix.score = lambda req, state, cands, score=score, seen=seen: (  # type: ignore[method-assign]
            seen.append(len(cands)) or score(req, state, cands))
        decided.append(outcome(await sched.schedule(SchedRequest("r", MODEL, identity, None), states)))
        scored.append(sum(seen))
    assert decided[0] == decided[1] and decided[0][:2] == ("uid-p000", 1)
    assert scored == [6, 600]  # three of each bucket (`max_attempts` 3): the head's slot, an empty one

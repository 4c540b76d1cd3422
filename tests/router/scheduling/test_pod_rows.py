"""The scheduler's pod rows (scheduling/pod_rows.py): a pod-local scorer is asked once per view of a pod,
and a scheduler reused over a fleet whose views change decides exactly as a new one would."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar

import pytest

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling import pod_rows
from llamafleet_router.scheduling.config import load_config
from llamafleet_router.scheduling.framework import (
    Candidate,
    CycleState,
    EndpointState,
    PluginParams,
    PluginSpec,
    SchedRequest,
)
from llamafleet_router.scheduling.plugins.scorers.free_slots import FreeSlotsScorer
from llamafleet_router.scheduling.plugins.scorers.queue_depth import QueueDepthScorer
from llamafleet_router.scheduling.pod_rows import PodRows
from llamafleet_router.scheduling.registry import register, register_builtin_plugins
from llamafleet_router.scheduling.scheduler import Scheduler
from tests.router.scheduling.fakes import BLOCK_CHARS, MODEL, chain, prompt
from tests.router.scheduling.test_prune_unknown import PIPELINE, SLOTS, fleet, outcome, populate


class _Counting(QueueDepthScorer):
    """queue-depth that counts the views it was asked about."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.asked: list[str] = []

    def score_pod(self, endpoint: EndpointState) -> float:
        self.asked.append(endpoint.endpoint.pod.uid)
        return super().score_pod(endpoint)


def changed(rng: random.Random, s: EndpointState) -> EndpointState:
    """A new view of the pod of `s` (as fleet/state.py builds one when a request begins or ends)."""
    busy = frozenset(slot for slot in range(SLOTS) if rng.random() < 0.5)
    return EndpointState(s.endpoint, busy_slots=busy, in_flight=len(busy), queue_depth=rng.randrange(4),
                         slot_last_used={slot: rng.randrange(1000) for slot in range(SLOTS)})


def test_a_row_is_computed_once_per_view_and_anew_when_the_view_changes() -> None:
    rng = random.Random(3)
    states = fleet(rng)
    queue = _Counting("queue")
    rows = PodRows([(queue, "queue-depth", "queue", 2.0),
                    (FreeSlotsScorer("free"), "free-slots", "free", 1.0)])
    reported: list[str] = []
    first = rows.refresh(states, lambda type_name, name, started: reported.append(name))
    assert queue.asked == [s.uid for s in states] and reported == ["queue", "free"]
    assert [row.state for row in first] == states
    for row in first:
        assert row.scores == (1 / (1 + row.state.queue_depth), len(row.state.idle_slots) / SLOTS)
        assert row.total == pytest.approx(2 * row.scores[0] + row.scores[1])
    queue.asked.clear()
    assert rows.refresh(states) == first and queue.asked == []  # nothing changed: nothing asked
    states[5], states[9] = changed(rng, states[5]), changed(rng, states[9])
    again = rows.refresh(states)
    assert queue.asked == [states[5].uid, states[9].uid]
    assert again[5].state is states[5] and again[5].scores[0] == 1 / (1 + states[5].queue_depth)
    assert rows.column(0)[states[9].uid] == again[9].scores[0]
    assert rows.column(1).get("no-such-pod") is None


def test_rows_of_pods_gone_are_forgotten_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_rows, "_TRACKED_PODS", 10)
    states = fleet(random.Random(4))
    queue = _Counting("queue")
    rows = PodRows([(queue, "queue-depth", "queue", 1.0)])
    for i in range(0, len(states), 5):  # a fleet seen five pods at a time
        rows.refresh(states[i:i + 5])
    assert len(rows.column(0)) == 10 and set(rows.column(0)) == {s.uid for s in states[-10:]}
    queue.asked.clear()
    assert [row.state for row in rows.refresh(states[:2])] == states[:2]  # forgotten: computed again
    assert queue.asked == [states[0].uid, states[1].uid]


def test_a_pod_whose_view_changed_is_kept_as_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A's row is the oldest, then A's view changes: when the rows are full, B goes, not A."""
    monkeypatch.setattr(pod_rows, "_TRACKED_PODS", 2)
    rng = random.Random(6)
    a, b, c = fleet(rng)[:3]
    queue = _Counting("queue")
    rows = PodRows([(queue, "queue-depth", "queue", 1.0)])
    rows.refresh([a])
    rows.refresh([b])
    a = changed(rng, a)
    rows.refresh([a])
    rows.refresh([c])
    assert set(rows.column(0)) == {a.uid, c.uid}
    queue.asked.clear()
    assert [row.state for row in rows.refresh([a, c])] == [a, c] and queue.asked == []


def test_a_fleet_larger_than_the_bound_keeps_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows grow to twice the endpoints of a request: a fleet past the bound (10,000 pods against
    4,096 rows) neither loses the rows it was just given nor has them computed again."""
    monkeypatch.setattr(pod_rows, "_TRACKED_PODS", 4)
    states = fleet(random.Random(7))
    queue = _Counting("queue")
    rows = PodRows([(queue, "queue-depth", "queue", 1.0)])
    assert [row.state for row in rows.refresh(states)] == states
    queue.asked.clear()
    assert [row.state for row in rows.refresh(states)] == states and queue.asked == []


@pytest.mark.parametrize("scorer", [QueueDepthScorer("q"), FreeSlotsScorer("f")])
def test_score_pod_agrees_with_the_scorers_other_answers(scorer: Any) -> None:
    states = fleet(random.Random(5))
    req = SchedRequest("r", MODEL, prompt(MODEL, chain("q", 4)), session_id=None)
    by_pod = scorer.score_pods(req, CycleState(), states)
    by_slot = scorer.score(req, CycleState(), [Candidate(s, 0) for s in states])
    for s in states:
        assert scorer.score_pod(s) == by_pod[s.uid] == by_slot[SlotRef(s.uid, 0)]


@pytest.mark.parametrize("seed", range(12))
async def test_a_reused_scheduler_decides_as_a_new_one_while_views_change(seed: int) -> None:
    """Twenty requests over a fleet whose pods' views change between them (requests begun and ended
    elsewhere): each decision, pruned or not, equals that of a new scheduler that scores every pod."""
    rng = random.Random(seed)
    states = fleet(rng)
    index = InMemoryPrefixIndex()
    await populate(rng, index, states)
    config = load_config(PIPELINE)
    reused = {prune: Scheduler(config, index=index, leases=InMemorySlotLeases(), holder_prefix="me",
                               score_every_pod=not prune) for prune in (True, False)}
    for step in range(20):
        for i in rng.sample(range(len(states)), 6):
            states[i] = changed(rng, states[i])
        identity = prompt(MODEL, chain("q", 14), session_prefix_chars=8 * BLOCK_CHARS,
                          shared_chars=4 * BLOCK_CHARS, head_tag="head-q",
                          conversation_tag=f"conv-{rng.randrange(3)}")
        req = SchedRequest(f"r{seed}-{step}", MODEL, identity, session_id=None)
        for prune, sched in reused.items():
            new = Scheduler(config, index=index, leases=InMemorySlotLeases(), holder_prefix="me",
                            score_every_pod=True)
            expected = await new.schedule(req, states)
            got = await sched.schedule(req, states)
            assert outcome(got) == outcome(expected), (step, prune)
            await sched.release(got)
            await new.release(expected)


class _GatedQueue(QueueDepthScorer):
    """queue-depth that applies only to requests of a session: pod-local, but asked per request."""

    type_name: ClassVar[str] = "gated-queue"

    def applies(self, req: SchedRequest, state: CycleState) -> bool:
        return req.session_id is not None


async def test_a_gated_pod_local_scorer_counts_only_where_it_applies() -> None:
    """Its score must not enter the rows' totals: a request it does not apply to ranks without it."""
    registry = register_builtin_plugins()
    register(registry, PluginSpec("gated-queue", "scorer", PluginParams, _GatedQueue.create))
    pipeline = """
plugins:
  - {type: healthy}
  - {type: gated-queue, name: gq}
  - {type: free-slots, name: free}
  - {type: max-score}
profile:
  plugins:
    - {ref: healthy}
    - {ref: gq, weight: 5}
    - {ref: free, weight: 1}
    - {ref: max-score}
"""
    states = fleet(random.Random(6))
    best_free = max(len(s.idle_slots) for s in states)
    states = [EndpointState(s.endpoint, busy_slots=s.busy_slots, in_flight=s.in_flight,
                            # the pods with the most idle slots have the longest queues
                            queue_depth=5 if len(s.idle_slots) == best_free else 0) for s in states]
    queued_pods = {s.uid for s in states if s.queue_depth}
    sched = Scheduler(load_config(pipeline, registry), index=InMemoryPrefixIndex(),
                      leases=InMemorySlotLeases(), holder_prefix="me", registry=registry)
    for session, queued in ((None, True), ("s", False), (None, True)):
        req = SchedRequest(f"r-{session}", MODEL, prompt(MODEL, chain("g", 4)), session_id=session)
        decision = await sched.schedule(req, states)
        assert (decision.endpoint.pod.uid in queued_pods) is queued, session
        await sched.release(decision)



def test_views_are_numbered_apart_and_still_compare_by_their_fields() -> None:
    """`EndpointState.view`, which rows are found by: another view of the same pod, even an equal one,
    has another number, so a kept row never stands for a view it was not computed from."""
    s = fleet(random.Random(8))[0]
    again = EndpointState(s.endpoint, busy_slots=s.busy_slots, queue_depth=s.queue_depth,
                          in_flight=s.in_flight, slot_last_used=s.slot_last_used)
    replaced = dataclasses.replace(s, queue_depth=s.queue_depth + 1)
    assert again == s and len({s.view, again.view, replaced.view}) == 3
    rows = PodRows([(_Counting("queue"), "queue-depth", "queue", 1.0)])
    first, = rows.refresh([s])
    second, = rows.refresh([again])
    assert second is not first and second.state is again


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_ranking_holds_every_kept_row_in_order(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """After views change, pods leave (rows forgotten when full) and another model's pods come: per
    model and pod kind, `ranked` names exactly the rows kept, best first."""
    monkeypatch.setattr(pod_rows, "_TRACKED_PODS", 40)
    rng = random.Random(seed)
    states = fleet(rng) + [EndpointState(dataclasses.replace(s.endpoint, model="other"))
                           for s in fleet(random.Random(seed + 100))[:10]]
    rows = PodRows([(QueueDepthScorer("queue"), "queue-depth", "queue", 1.0),
                    (FreeSlotsScorer("free"), "free-slots", "free", 0.5)])
    for _ in range(30):
        for i in rng.sample(range(len(states)), 8):
            states[i] = changed(rng, states[i])
        rows.refresh(rng.sample(states, rng.randrange(5, 30)))
    kept = list(rows.by_uid.values())
    for model in (MODEL, "other"):
        expected: dict[int, list[tuple[float, str]]] = {}
        for row in kept:
            if row.state.endpoint.model == model:
                expected.setdefault(row.kind, []).append(row.order)
        got = {kind: list(orders) for kind, orders in rows.ranked(model)}
        assert got == {kind: sorted(orders) for kind, orders in expected.items()}

"""The scheduler end to end with the default config, fake index and shared fake leases."""

from __future__ import annotations

import asyncio

import pytest

from llamafleet_core.types import Action, Lookup
from llamafleet_router.scheduling.config import default_config
from llamafleet_router.scheduling.framework import ANY_SLOT, EndpointState, NoEndpointError
from llamafleet_router.scheduling.scheduler import Scheduler

from .fakes import MODEL, FakeIndex, FakeLeases, request, slot, snapshot, state


def make(
    index: FakeIndex, leases: FakeLeases | None = None, holder: str = "router-1", **kw: object
) -> Scheduler:
    return Scheduler(
        default_config(),
        index=index,
        leases=leases or FakeLeases(),
        holder_prefix=holder,
        **kw,  # type: ignore[arg-type]
    )


def fleet(**busy: tuple[int, ...]) -> list[EndpointState]:
    return [state(n, busy=busy.get(n, ())) for n in "abc"]


async def test_goes_direct_to_the_slot_holding_the_prefix() -> None:
    """Pod b slot 2 holds 9 of 10 blocks: the request is pinned there, leased, DIRECT."""
    leases = FakeLeases()
    sched = make(FakeIndex(Lookup(slots={slot("b", 2): 9, slot("a", 0): 2})), leases)
    d = await sched.schedule(request(n_blocks=10), fleet())
    assert (d.endpoint.pod.name, d.slot, d.action, d.branch, d.predicted_blocks) == (
        "b",
        2,
        Action.DIRECT,
        "slot_hit",
        9,
    )
    assert d.lease_holder == "router-1:r1"
    assert leases.held == {slot("b", 2): "router-1:r1"}
    await sched.release(d)
    assert leases.held == {}


async def test_restores_snapshot_into_another_slot_when_holder_slot_is_busy() -> None:
    """b's slot 2 is busy; b's local snapshot of the prefix is restored into an idle slot of b."""
    index = FakeIndex(Lookup(slots={slot("b", 2): 10}, snapshots=(snapshot("pfx", "b", 10),)))
    d = await make(index).schedule(request(n_blocks=40), fleet(b=(2,)))
    assert (d.endpoint.pod.name, d.action, d.branch) == ("b", Action.RESTORE, "restore")
    assert d.slot != 2
    assert d.snapshot is not None and d.snapshot.name == "pfx"


async def test_sessions_of_a_known_head_fill_half_a_pod_then_go_to_the_idle_one() -> None:
    """Concurrent sessions of a head whose snapshot is on a: the 2nd restores on a beside the 1st; with
    half of a's slots busy the 3rd goes to the idle b and pulls the snapshot (every pod gets work)."""
    snap = snapshot("head", "a", 10)
    second = await make(FakeIndex(Lookup(slots={slot("a", 0): 10}, snapshots=(snap,)))).schedule(
        request(n_blocks=12), [state("a", busy=(0,)), state("b")])
    assert (second.endpoint.pod.name, second.action) == ("a", Action.RESTORE)
    both_busy = Lookup(slots={slot("a", 0): 10, slot("a", 1): 10}, snapshots=(snap,))
    third = await make(FakeIndex(both_busy)).schedule(request(n_blocks=12),
                                                      [state("a", busy=(0, 1)), state("b")])
    assert (third.endpoint.pod.name, third.action) == ("b", Action.RESTORE)
    assert third.snapshot is not None and third.snapshot.pod_uid == "uid-a"  # pulled from a


async def test_a_restore_goes_into_the_slot_released_longest_ago() -> None:
    """The restore replaces the slot's content: not the picked slot holding another session's
    recent turn (slot 0, released last), but the pod's idle slot used longest ago (slot 3); the lease
    moves with it."""
    leases = FakeLeases()
    index = FakeIndex(Lookup(slots={slot("b", 0): 4}, snapshots=(snapshot("pfx", "b", 30),)))
    b = state("b", last_used={0: 9, 1: 7, 2: 8, 3: 2})
    d = await make(index, leases).schedule(request(n_blocks=40), [b])
    assert (d.action, d.slot) == (Action.RESTORE, 3)
    assert leases.held == {slot("b", 3): "router-1:r1"}


async def test_a_restore_stays_in_a_slot_that_already_holds_the_snapshot() -> None:
    """A primed slot holding the whole snapshot keeps the decision (the restore may be skipped there)."""
    index = FakeIndex(Lookup(slots={slot("b", 0): 30}, snapshots=(snapshot("pfx", "b", 30),)))
    b = state("b", resume_anywhere=False, last_used={0: 9, 3: 2})
    req = request(n_blocks=40, session_blocks=30)
    d = await make(index).schedule(req, [b])
    assert (d.action, d.slot) == (Action.RESTORE, 0)


async def test_a_hybrid_conversation_goes_back_to_its_own_slot_not_a_restore() -> None:
    """Two slots hold the head's whole blocks, the head snapshot is local: the slot the index tags
    with this conversation is resumed as it is; without the tag, the head is restored."""
    snaps = (snapshot("head", "b", 30),)
    slots = {slot("b", 0): 30, slot("b", 1): 30}
    req = request(n_blocks=40, session_blocks=36, shared_blocks=30)
    b = state("b", resume_anywhere=False, last_used={0: 5, 1: 9})
    tagged = Lookup(slots=slots, snapshots=snaps, conversation=slot("b", 1))
    own = await make(FakeIndex(tagged)).schedule(req, [b])
    assert (own.action, own.slot, own.branch) == (Action.DIRECT, 1, "slot_hit")
    other = await make(FakeIndex(Lookup(slots=slots, snapshots=snaps))).schedule(req, [b])
    assert other.action is Action.RESTORE and other.slot != 1


async def test_uses_another_slot_when_holder_slot_is_busy_and_no_snapshot_exists() -> None:
    """Without a snapshot, the request is computed on an idle slot; the busy slot is never chosen."""
    index = FakeIndex(Lookup(slots={slot("b", 2): 10}))
    d = await make(index).schedule(request(n_blocks=10), fleet(b=(2,)))
    assert (d.endpoint.pod.name, d.slot) != ("b", 2)
    assert d.action is Action.COMPUTE
    assert d.lease_holder is not None


async def test_two_schedulers_agree_on_the_pod_when_index_is_down() -> None:
    """Redis down: replicas with no shared state send the same session prefix to the same pod."""
    eps = [state(n) for n in "abcdef"]
    one = make(FakeIndex(down=True), holder="r1")
    two = make(FakeIndex(down=True), holder="r2")
    pods = set()
    for i in range(20):
        req = request("sys", 12, session_blocks=6, request_id=f"q{i}")
        d1 = await one.schedule(req, eps)
        d2 = await two.schedule(req, list(reversed(eps)))
        assert d1.branch == d2.branch == "degraded_hash"
        assert d1.action is Action.DIRECT
        assert d1.endpoint == d2.endpoint
        pods.add(d1.endpoint.pod.name)
        await one.release(d1)
        await two.release(d2)
    assert len(pods) == 1


async def test_session_goes_back_to_its_slot_when_index_is_down() -> None:
    """Affinity beats the degraded hash: the previous turn's slot holds the whole conversation."""
    eps = [state(n) for n in "abcd"]
    sched = make(FakeIndex(down=True))
    first = await sched.schedule(request("x", 8, session_blocks=4, session_id="s1"), eps)
    await sched.release(first)
    # The same session with a different system prompt would hash elsewhere; affinity keeps it.
    second = await sched.schedule(request("y", 8, session_blocks=4, session_id="s1", request_id="r2"), eps)
    assert (second.endpoint, second.slot, second.branch) == (first.endpoint, first.slot, "session_affinity")


async def test_concurrent_schedulers_never_lease_the_same_slot_twice() -> None:
    """Two replicas sharing one lease store: at any moment each slot has at most one leased request.

    All 12 requests see the same (stale) load picture, so they all prefer the same slots; the lease is
    what keeps them apart. 8 slots exist, so 4 requests end up queued without a lease.
    """
    leases = FakeLeases()
    index = FakeIndex(Lookup(slots={slot("a", 0): 10}))
    eps = [state("a"), state("b")]
    one, two = make(index, leases, "r1"), make(index, leases, "r2")
    reqs = [request(n_blocks=10, request_id=f"q{i}") for i in range(12)]
    decisions = await asyncio.gather(*((one if i % 2 else two).schedule(r, eps) for i, r in enumerate(reqs)))
    leased = [d for d in decisions if d.lease_holder is not None]
    assert len(leased) == 8
    assert len({d.slot_ref for d in leased}) == 8
    assert {d.branch for d in decisions if d.lease_holder is None} == {"queued"}
    assert len(leases.held) == 8
    await asyncio.gather(*(one.release(d) for d in decisions))
    assert leases.held == {}


async def test_queues_on_the_slot_holding_most_of_the_prefix_when_all_slots_are_busy() -> None:
    """Every slot busy: no lease, pinned to the slot with the longest match (llama-server defers it)."""
    eps = [state("a", busy=(0, 1, 2, 3)), state("b", busy=(0, 1, 2, 3))]
    d = await make(FakeIndex(Lookup(slots={slot("b", 3): 7, slot("b", 1): 2}))).schedule(request(), eps)
    assert (d.endpoint.pod.name, d.slot, d.branch, d.lease_holder, d.predicted_blocks) == (
        "b",
        3,
        "queued",
        None,
        7,
    )


async def test_queued_requests_join_the_shortest_queue_of_the_slots_holding_the_prefix_alike() -> None:
    """Both slots of the only pod hold the SharedPrefix and are busy. Each queued request is pinned to
    the slot with the fewest of the gateway's requests (as `InFlight` counts them, through
    `endpoint_states`), so three of them split 2 and 1 instead of all waiting behind slot 0 while
    slot 1 frees and goes to newcomers (seen in the llama-server kill scenario: one request lost)."""
    from prometheus_client import CollectorRegistry

    from llamafleet_router.discovery.base import PodProps, PodStatus
    from llamafleet_router.fleet.state import InFlight, endpoint_states
    from llamafleet_router.metrics import RouterMetrics

    pod = state("a", n_slots=2).endpoint
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    for running in (0, 1):  # one leased request on each slot
        flight.begin(pod.uid, pod.url, running)
    sched = make(FakeIndex(Lookup(slots={slot("a", 0): 7, slot("a", 1): 7})))
    pinned = []
    for i in range(3):
        eps = endpoint_states(MODEL, [PodStatus(pod, PodProps(MODEL, 2))], flight)
        d = await sched.schedule(request(request_id=f"q{i}"), eps)
        assert (d.branch, d.lease_holder, d.predicted_blocks) == ("queued", None, 7)
        flight.begin(pod.uid, pod.url, d.slot)  # as the gateway counts it until it ends
        pinned.append(d.slot)
    assert pinned == [0, 1, 0]


async def test_queued_request_without_any_match_is_not_pinned() -> None:
    """Pinning to a busy slot that holds nothing only adds waiting: let the server choose."""
    eps = [state("a", busy=(0, 1, 2, 3), queue=3), state("b", busy=(0, 1, 2, 3))]
    d = await make(FakeIndex()).schedule(request(), eps)
    assert (d.endpoint.pod.name, d.slot, d.branch) == ("b", ANY_SLOT, "queued")


async def test_proceeds_without_lease_when_lease_store_is_down() -> None:
    """Redis down for leases must not fail the request."""
    leases = FakeLeases(down=True)
    sched = make(FakeIndex(Lookup(slots={slot("b", 2): 9})), leases)
    d = await sched.schedule(request(), fleet())
    assert (d.endpoint.pod.name, d.slot, d.lease_holder) == ("b", 2, None)
    assert leases.acquires == 1
    await sched.release(d)


async def test_raises_no_endpoint_when_no_pod_serves_the_model() -> None:
    with pytest.raises(NoEndpointError, match="model"):
        await make(FakeIndex()).schedule(request(model="unknown"), fleet())


async def test_reports_latency_of_every_plugin_to_metrics_hook() -> None:
    calls: list[tuple[str, str, str, float]] = []
    sched = make(FakeIndex(), metrics_hook=lambda *a: calls.append(a))
    await sched.schedule(request(), fleet())
    points = {(p, t) for p, t, _, _ in calls}
    assert {
        ("producer", "prefix-lookup"),
        ("filter", "healthy"),
        ("scorer", "prefix-match"),
        ("picker", "max-score"),
    } <= points
    assert all(seconds >= 0 for *_, seconds in calls)

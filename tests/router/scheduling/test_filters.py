"""Filters: each one with hand-built endpoints."""

from __future__ import annotations

from llamafleet_core.types import Lookup
from llamafleet_router.scheduling.framework import INDEX_AVAILABLE, LOOKUP, CycleState
from llamafleet_router.scheduling.plugins.filters.bounded_load import BoundedLoadFilter, BoundedLoadParams
from llamafleet_router.scheduling.plugins.filters.has_idle_slot import HasIdleSlotFilter
from llamafleet_router.scheduling.plugins.filters.healthy import HealthyFilter
from llamafleet_router.scheduling.plugins.filters.model import ModelFilter

from .fakes import request, slot, snapshot, state


def names(states: list) -> list[str]:  # type: ignore[type-arg]
    return [s.endpoint.pod.name for s in states]


def test_healthy_drops_unhealthy_and_not_ready_endpoints() -> None:
    """Only endpoints both healthy (probes) and ready (warm) survive."""
    eps = [state("a"), state("b", healthy=False), state("c", ready=False)]
    assert names(HealthyFilter("healthy").filter(request(), CycleState(), eps)) == ["a"]


def test_healthy_returns_empty_when_nothing_is_healthy() -> None:
    """The filter does not invent capacity; the scheduler turns this into NoEndpointError."""
    assert HealthyFilter("h").filter(request(), CycleState(), [state("a", healthy=False)]) == []


def test_model_keeps_only_endpoints_serving_the_requested_model() -> None:
    eps = [state("a"), state("b", model="other"), state("c")]
    assert names(ModelFilter("model").filter(request(), CycleState(), eps)) == ["a", "c"]


def test_has_idle_slot_drops_full_endpoints_when_some_have_idle_slots() -> None:
    """A pod whose every slot is busy is dropped while another pod has a free slot."""
    eps = [state("a", busy=(0, 1, 2, 3)), state("b", busy=(0,)), state("c", busy=(1, 2))]
    assert names(HasIdleSlotFilter("h").filter(request(), CycleState(), eps)) == ["b", "c"]


def test_has_idle_slot_keeps_all_when_every_endpoint_is_full() -> None:
    """With the whole fleet full, requests queue on a pod rather than fail."""
    eps = [state("a", busy=(0, 1), n_slots=2), state("b", busy=(0, 1), n_slots=2)]
    assert names(HasIdleSlotFilter("h").filter(request(), CycleState(), eps)) == ["a", "b"]


def test_bounded_load_drops_endpoint_far_above_mean_when_it_has_no_idle_slot() -> None:
    """Load 10 on a full pod against 0 and 1 elsewhere: threshold 1.25*(11+1)/3 = 5 drops it."""
    eps = [
        state("a", busy=(0, 1), n_slots=2, queue=8),
        state("b", n_slots=2),
        state("c", busy=(0,), n_slots=2),
    ]
    assert names(BoundedLoadFilter("bl", BoundedLoadParams()).filter(request(), CycleState(), eps)) == [
        "b",
        "c",
    ]


def test_bounded_load_keeps_busy_endpoint_with_idle_slot_when_exempt_idle() -> None:
    """A pod with a free slot starts the request at once: dropping it would lose its prefix, when it
    holds the prompt past what any snapshot gives (a conversation's own slot, a head no snapshot holds);
    below half busy it is kept whatever it holds."""
    eps = [state("a", busy=(0, 1, 2), in_flight=3), state("b", in_flight=0), state("c", in_flight=0)]
    held = CycleState()
    held.write(LOOKUP, Lookup(slots={slot("a", 3): 6}, snapshots=(snapshot("head", "a", 4),)))
    assert names(BoundedLoadFilter("bl", BoundedLoadParams()).filter(request(n_blocks=10), held, eps)) == [
        "a", "b", "c"]
    light = [state("a", busy=(0,), in_flight=1), state("b", in_flight=0), state("c", in_flight=0)]
    assert names(BoundedLoadFilter("bl", BoundedLoadParams()).filter(request(), CycleState(), light)) == [
        "a", "b", "c"]


def test_bounded_load_spreads_new_sessions_of_a_known_head_once_a_pod_is_half_busy() -> None:
    """All a holds is the head, which its snapshot gives b and c as well: from half its slots busy, a
    new session goes where the load is lower (its agent pulls the snapshot). A --slot-attach pod keeps
    them (one copy of the head serves its slots), and `spread_busy_share: 1` is the old rule."""
    head = CycleState()
    head.write(LOOKUP, Lookup(slots={slot("a", 0): 4, slot("a", 3): 4},
                              snapshots=(snapshot("head", "a", 4),)))
    eps = [state("a", busy=(0, 1), in_flight=2), state("b", in_flight=0), state("c", in_flight=0)]
    flt = BoundedLoadFilter("bl", BoundedLoadParams())
    assert names(flt.filter(request(n_blocks=10), head, eps)) == ["b", "c"]
    attach = [state("a", busy=(0, 1), in_flight=2, attach=True), *eps[1:]]
    assert names(flt.filter(request(n_blocks=10), head, attach)) == ["a", "b", "c"]
    old = BoundedLoadFilter("bl", BoundedLoadParams(spread_busy_share=1.0))
    assert names(old.filter(request(n_blocks=10), head, eps)) == ["a", "b", "c"]
    down = CycleState()  # the index is down: what a pod holds is unknown, so its affinity is kept
    down.write(INDEX_AVAILABLE, False)
    assert names(flt.filter(request(n_blocks=10), down, eps)) == ["a", "b", "c"]


def test_bounded_load_drops_loaded_endpoint_when_idle_is_not_exempt() -> None:
    """Plain KubeAI rule: load 3 > 1.25 * (3 + 1) / 3 = 1.67 is dropped."""
    eps = [state("a", busy=(0, 1, 2), in_flight=3), state("b", in_flight=0), state("c", in_flight=0)]
    flt = BoundedLoadFilter("bl", BoundedLoadParams(exempt_idle=False))
    assert names(flt.filter(request(), CycleState(), eps)) == ["b", "c"]


def test_bounded_load_keeps_everything_on_equal_load() -> None:
    """Equal loads are never above the mean: nothing is dropped, the list is never emptied."""
    eps = [state(n, busy=(0, 1), n_slots=2, queue=5) for n in "abc"]
    flt = BoundedLoadFilter("bl", BoundedLoadParams(exempt_idle=False))
    assert names(flt.filter(request(), CycleState(), eps)) == ["a", "b", "c"]

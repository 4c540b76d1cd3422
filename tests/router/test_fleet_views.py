"""The router's per-pod views (`InFlight.state_of`, through `endpoint_states`): kept between requests
while a pod is unchanged, and always what a fresh build from the books would say."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.discovery.base import PodProps, PodStatus
from llamafleet_router.fleet import state as fleet_state
from llamafleet_router.fleet.state import InFlight, endpoint_states
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.scheduling.framework import ANY_SLOT, EndpointState

MODEL = "m"


def pod(i: int, slots: int = 4) -> PodStatus:
    return PodStatus(Endpoint(PodRef(f"pod-{i}", f"uid-{i}", 1), f"http://10.0.0.{i}:8080", MODEL, slots),
                     PodProps(MODEL, slots))


def fresh(flight: InFlight, status: PodStatus) -> tuple[object, ...]:
    """What a view built from the books now holds."""
    uid = status.endpoint.uid
    requests = flight.slot_requests(uid)
    return (status.endpoint, frozenset(requests), flight.last_used(uid), requests, flight.count(uid))


def held(view: EndpointState) -> tuple[object, ...]:
    return (view.endpoint, view.busy_slots, dict(view.slot_last_used), dict(view.slot_requests),
            view.in_flight)


def test_a_pods_view_is_kept_until_a_request_begins_or_ends_on_it_or_discovery_replaces_it() -> None:
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pods = [pod(i) for i in range(3)]
    first = endpoint_states(MODEL, pods, flight)
    again = endpoint_states(MODEL, pods, flight)
    assert all(a is b for a, b in zip(first, again, strict=True))
    flight.begin("uid-1", "pod-1", 2)
    after = endpoint_states(MODEL, pods, flight)
    assert after[0] is first[0] and after[2] is first[2] and after[1] is not first[1]
    assert after[1].busy_slots == {2} and after[1].in_flight == 1 and after[1].idle_slots == (0, 1, 3)
    flight.end("uid-1", "pod-1", 2)
    ended = endpoint_states(MODEL, pods, flight)[1]
    assert ended.busy_slots == frozenset() and ended.slot_last_used == {2: 1}
    pods[0] = pod(0, slots=2)  # a new poll's PodStatus for the same uid
    assert endpoint_states(MODEL, pods, flight)[0].endpoint.n_slots == 2


@pytest.mark.parametrize("tracked", [4096, 5])
def test_views_agree_with_the_books_through_random_traffic_and_forgetting(
        tracked: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of pods, requests beginning and ending in random order (some on no slot), and, with a
    small book, pods forgotten along the way: every view equals a fresh build."""
    monkeypatch.setattr(fleet_state, "_TRACKED_PODS", tracked)
    rng = random.Random(25)
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pods = [pod(i) for i in range(200)]
    running: list[tuple[str, int]] = []
    for step in range(3000):
        if running and rng.random() < 0.45:
            uid, slot = running.pop(rng.randrange(len(running)))
            flight.end(uid, uid, slot)
        else:
            i = rng.randrange(len(pods))
            slot = ANY_SLOT if rng.random() < 0.1 else rng.randrange(4)
            flight.begin(pods[i].endpoint.uid, pods[i].endpoint.uid, slot)
            running.append((pods[i].endpoint.uid, slot))
        if step % 97 == 0:
            # A small book is kept small by viewing two pods at a time (a view of every pod would grow
            # the books to twice the fleet).
            viewed = pods if tracked > len(pods) else rng.sample(pods, 2)
            for status, view in zip(viewed, endpoint_states(MODEL, viewed, flight), strict=True):
                assert held(view) == fresh(flight, status), (step, status.endpoint.uid)
            # The batch read (its kept-view check inlined) hands out what `state_of` does.
            assert list(map(held, flight.states_of(viewed))) == [held(flight.state_of(p)) for p in viewed]
    assert flight.total() == len(running)


def test_a_fleet_larger_than_the_books_keeps_every_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """The books grow to twice the fleet viewed: else each request would forget the pods viewed first
    and build every view again (a 10,000-pod fleet against 4,096 uids)."""
    monkeypatch.setattr(fleet_state, "_TRACKED_PODS", 8)
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pods = [pod(i) for i in range(50)]
    endpoint_states(MODEL, pods, flight)
    for i in range(50):
        flight.begin(f"uid-{i}", f"pod-{i}", 0)
        flight.end(f"uid-{i}", f"pod-{i}", 0)
    first = endpoint_states(MODEL, pods, flight)
    assert [view.slot_last_used for view in first] == [{0: i + 1} for i in range(50)]
    flight.begin("uid-7", "pod-7", 1)
    again = endpoint_states(MODEL, pods, flight)
    assert [a is b for a, b in zip(first, again, strict=True)] == [i != 7 for i in range(50)]
    assert again[7].busy_slots == {1}


def test_a_view_whose_change_stamp_was_forgotten_is_built_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A's view is kept from before any change; A changes, and then its stamp is forgotten (a full
    book) before A is viewed again: the kept view cannot be checked any more, so it is not used."""
    monkeypatch.setattr(fleet_state, "_TRACKED_PODS", 2)
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    a, b, c = pod(1), pod(2), pod(3)
    assert flight.state_of(a).busy_slots == frozenset()
    flight.begin("uid-1", "a", 0)
    flight.begin("uid-2", "b", 0)
    flight.begin("uid-3", "c", 0)  # A's stamp is forgotten here
    assert held(flight.state_of(a)) == fresh(flight, a) and flight.state_of(a).busy_slots == {0}
    assert held(flight.state_of(b)) == fresh(flight, b) and held(flight.state_of(c)) == fresh(flight, c)


def test_a_view_whose_release_times_were_forgotten_is_built_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A's release time is forgotten (a full book) while its change stamp stays: its kept view, which
    still has the release, is not used."""
    monkeypatch.setattr(fleet_state, "_TRACKED_PODS", 2)
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    a = pod(1)
    flight.begin("uid-2", "b", 0)
    flight.begin("uid-1", "a", 0)
    flight.end("uid-1", "a", 0)
    assert flight.state_of(a).slot_last_used == {0: 1}
    flight.end("uid-2", "b", 0)
    flight.begin("uid-3", "c", ANY_SLOT)  # forgets B's stamp, not A's
    flight.end("uid-3", "c", 0)  # forgets A's release time
    assert flight.last_used("uid-1") == {}
    assert held(flight.state_of(a)) == fresh(flight, a)


def _ready(pods: list[PodStatus], model: str, exclude: frozenset[str]) -> list[PodStatus]:
    return [p for p in pods if p.ready and p.model == model and p.endpoint.uid not in exclude]


def _variant(i: int, rng: random.Random) -> PodStatus:
    """A new status for pod `i`: another size, down, not read yet, or serving another model."""
    status = pod(i, slots=rng.choice((1, 2, 4)))
    roll = rng.random()
    if roll < 0.2:
        return PodStatus(replace(status.endpoint, ready=False), status.props)
    if roll < 0.3:
        return PodStatus(status.endpoint, None)
    if roll < 0.45:
        return PodStatus(status.endpoint, PodProps("other", status.endpoint.n_slots))
    return status


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_list_of_a_models_views_agrees_with_a_fresh_read_through_fleet_changes(seed: int) -> None:
    """Discovery's list kept, changed in place (new statuses, swapped pods), grown and shrunk; requests
    beginning and ending; two models and retries that exclude pods: every read equals one from
    scratch, in discovery's order."""
    rng = random.Random(seed)
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pods = [pod(i) for i in range(60)]
    running: list[tuple[str, int]] = []
    for step in range(1500):
        roll = rng.random()
        if roll < 0.05:
            i = rng.randrange(len(pods))
            pods[i] = _variant(int(pods[i].endpoint.uid.split("-")[1]), rng)
        elif roll < 0.07:
            i, j = rng.randrange(len(pods)), rng.randrange(len(pods))
            pods[i], pods[j] = pods[j], pods[i]
        elif roll < 0.08:
            pods.append(pod(1000 + step))
        elif roll < 0.09 and len(pods) > 2:
            pods.pop(rng.randrange(len(pods)))
        elif running and roll < 0.5:
            uid, slot = running.pop(rng.randrange(len(running)))
            flight.end(uid, uid, slot)
        else:
            uid = rng.choice(pods).endpoint.uid
            slot = ANY_SLOT if rng.random() < 0.1 else rng.randrange(4)
            flight.begin(uid, uid, slot)
            running.append((uid, slot))
        model = "other" if rng.random() < 0.2 else MODEL
        exclude = frozenset({rng.choice(pods).endpoint.uid}) if rng.random() < 0.05 else frozenset()
        expected = _ready(pods, model, exclude)
        if not expected:
            continue
        # A copy now and then: discovery may hand out a new list of the same statuses.
        read = endpoint_states(model, list(pods) if step % 7 == 0 else pods, flight, exclude)
        assert [v.endpoint for v in read] == [p.endpoint for p in expected], step
        assert list(map(held, read)) == [fresh(flight, p) for p in expected], step


def test_a_read_of_the_same_list_looks_only_at_the_pods_changed_since(
        monkeypatch: pytest.MonkeyPatch) -> None:
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pods = [pod(i) for i in range(100)]
    endpoint_states(MODEL, pods, flight)
    looked: list[int] = []
    states_of = flight.states_of
    monkeypatch.setattr(flight, "states_of", lambda some: looked.append(len(some)) or states_of(some))
    flight.begin("uid-3", "pod-3", 0)
    flight.begin("uid-40", "pod-40", 1)
    read = endpoint_states(MODEL, list(pods), flight)
    assert sorted(looked) == [1, 1] and read[3].busy_slots == {0} and read[40].busy_slots == {1}
    looked.clear()
    pods[7] = pod(7, slots=2)
    assert endpoint_states(MODEL, pods, flight)[7].endpoint.n_slots == 2 and looked == [1]
    looked.clear()
    assert len(endpoint_states(MODEL, pods, flight)) == 100 and looked == []

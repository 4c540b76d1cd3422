"""The router's live view of the fleet: discovery's pods plus its own in-flight bookkeeping.

A slot is busy for scheduling when THIS router has a request on it. Other replicas' requests are kept
off it by the slot leases in Redis, which are exact, while `/slots` polls are up to one interval old: a
replica that trusted them would see a slot another replica just released as busy, and send a session
whose prefix that slot holds off to compute it elsewhere. (A request pinned to a slot that is busy with
a client outside the gateway waits for it: llama-server defers pinned tasks.) In-flight counts are
changed synchronously (never across an await), so a cancelled request can always give its count back
from a `finally`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.errors import bad_request, model_not_found, no_pod_available
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.scheduling.framework import ANY_SLOT, EndpointState

_TRACKED_PODS = 4096  # pod uids (a uid changes when a pod restarts) whose slot release times are kept


class InFlight:
    """Requests being proxied, per pod uid, and the slots they are pinned to."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics
        self._count: Counter[str] = Counter()
        self._slots: Counter[tuple[str, int]] = Counter()
        self._released: dict[str, dict[int, int]] = {}  # uid -> slot -> release sequence number
        self._seq = 0

    def begin(self, uid: str, pod_label: str, slot: int) -> None:
        self._count[uid] += 1
        if slot != ANY_SLOT:
            self._slots[(uid, slot)] += 1
        self._metrics.in_flight.labels(pod_label).inc()

    def end(self, uid: str, pod_label: str, slot: int) -> None:
        self._count[uid] -= 1
        if self._count[uid] <= 0:
            del self._count[uid]
        if slot != ANY_SLOT:
            self._slots[(uid, slot)] -= 1
            if self._slots[(uid, slot)] <= 0:
                del self._slots[(uid, slot)]
            self._seq += 1
            released = self._released.get(uid)
            if released is None:
                if len(self._released) >= _TRACKED_PODS:  # pods come and go: forget the oldest seen
                    del self._released[next(iter(self._released))]
                released = self._released[uid] = {}
            released[slot] = self._seq
        self._metrics.in_flight.labels(pod_label).dec()

    def count(self, uid: str) -> int:
        return self._count.get(uid, 0)

    def total(self) -> int:
        return sum(self._count.values())

    def slot_requests(self, uid: str) -> dict[int, int]:
        """Requests pinned to each slot of the pod (running or waiting there; its keys are the pod's
        busy slots): a copy."""
        return {slot: n for (pod, slot), n in self._slots.items() if pod == uid and n > 0}

    def last_used(self, uid: str) -> dict[int, int]:
        """When each slot of the pod was last released (sequence numbers, larger is later): a copy."""
        return dict(self._released.get(uid, ()))


def served_models(pods: Sequence[PodStatus]) -> list[str]:
    """Models of every pod whose `/props` was read at least once, sorted."""
    return sorted({pod.model for pod in pods if pod.model})


def resolve_model(requested: str | None, pods: Sequence[PodStatus]) -> str:
    """The model a request is for, or the right 4xx/503.

    - no `model` in the body: the fleet's only model, else 400;
    - a model no known pod serves: 404 `model_not_found`, unless some pod was never reached (its model is
      unknown, so the fleet may well serve it): then 503;
    - known but no pod serving it is up: 503."""
    models = served_models(pods)
    unknown = any(pod.props is None for pod in pods)
    if requested is None:
        if len(models) == 1:
            requested = models[0]
        elif not models:
            raise no_pod_available("(any model)")
        else:
            raise bad_request("`model` is required: this fleet serves " + ", ".join(models) + ".",
                              param="model", code="missing_required_parameter")
    if requested not in models:
        if unknown:
            raise no_pod_available(requested)
        raise model_not_found(requested)
    if not any(pod.ready and pod.model == requested for pod in pods):
        raise no_pod_available(requested)
    return requested


def _state(pod: PodStatus, in_flight: InFlight) -> EndpointState:
    requests = in_flight.slot_requests(pod.endpoint.uid)  # one pass gives both the queues and the busy
    return EndpointState(endpoint=pod.endpoint, busy_slots=frozenset(requests),
                         slot_last_used=in_flight.last_used(pod.endpoint.uid), slot_requests=requests,
                         in_flight=in_flight.count(pod.endpoint.uid), healthy=True)


def endpoint_states(
    model: str, pods: Sequence[PodStatus], in_flight: InFlight, exclude: frozenset[str] = frozenset()
) -> list[EndpointState]:
    """Ready pods serving `model` (minus `exclude`, pods that just refused a connection) as the
    scheduler's input."""
    states = [_state(pod, in_flight) for pod in pods
              if pod.ready and pod.model == model and pod.endpoint.uid not in exclude]
    if not states:
        raise no_pod_available(model)
    return states


def props_for(model: str, pods: Sequence[PodStatus]) -> PodStatus | None:
    """A ready pod of `model` to take its chat template from (all replicas of a model share one)."""
    return next((pod for pod in pods if pod.ready and pod.model == model), None)


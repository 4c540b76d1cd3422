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
from typing import Any

from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.errors import bad_request, model_not_found, no_pod_available
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.scheduling.framework import ANY_SLOT, EndpointState

# Pod uids (a uid changes when a pod restarts) whose release times and views are kept, at the least: the
# books grow to twice the largest fleet viewed, or a fleet larger than them would forget its pods in
# turn and build every view again on every request.
_TRACKED_PODS = 4096


class InFlight:
    """Requests being proxied, per pod uid, and the slots they are pinned to.

    Every request needs the scheduler's view of every pod of its model (`endpoint_states`), so at a
    thousand pods what that costs per pod is most of a decision. The books are kept per pod (a pod's
    slots are found without a walk of every pinned slot of the fleet), and each pod's `EndpointState`
    is kept until the pod changes: a request of this router begins or ends on it, or discovery gives
    a new `PodStatus` for it (an immutable value, so identity says it is the same). Per model, the
    list of views the last request got is kept too (`_ModelViews`): when discovery's list is the same
    again, only the pods changed since are looked at, instead of every pod of the fleet.
    """

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics
        self._count: Counter[str] = Counter()
        self._slots: dict[str, Counter[int]] = {}  # uid -> slot -> requests pinned there (absent: none)
        self._released: dict[str, dict[int, int]] = {}  # uid -> slot -> release sequence number
        self._seq = 0
        self._changes = 0  # a stamp per begin/end, never reused: a kept state is current while it matches
        self._changed_at: dict[str, int] = {}
        self._states: dict[str, tuple[PodStatus, int, EndpointState]] = {}
        self._room = _TRACKED_PODS  # how many uids each book keeps
        self._models: dict[str, _ModelViews] = {}

    def begin(self, uid: str, pod_label: str, slot: int) -> None:
        self._count[uid] += 1
        if slot != ANY_SLOT:
            self._slots.setdefault(uid, Counter())[slot] += 1
        self._changed(uid)
        self._metrics.in_flight.labels(pod_label).inc()

    def end(self, uid: str, pod_label: str, slot: int) -> None:
        self._count[uid] -= 1
        if self._count[uid] <= 0:
            del self._count[uid]
        if slot != ANY_SLOT:
            pinned = self._slots.get(uid)
            if pinned is not None:
                pinned[slot] -= 1
                if pinned[slot] <= 0:
                    del pinned[slot]
                if not pinned:
                    del self._slots[uid]
            self._seq += 1
            if (forgotten := _make_room(self._released, uid, self._room)) is not None:
                self._forget_view(forgotten)  # its view still says when its slots were released
            self._released.setdefault(uid, {})[slot] = self._seq
        self._changed(uid)
        self._metrics.in_flight.labels(pod_label).dec()

    def count(self, uid: str) -> int:
        return self._count.get(uid, 0)

    def total(self) -> int:
        return sum(self._count.values())

    def slot_requests(self, uid: str) -> dict[int, int]:
        """Requests pinned to each slot of the pod (running or waiting there; its keys are the pod's
        busy slots): a copy."""
        return dict(self._slots.get(uid, ()))

    def last_used(self, uid: str) -> dict[int, int]:
        """When each slot of the pod was last released (sequence numbers, larger is later): a copy."""
        return dict(self._released.get(uid, ()))

    def state_of(self, pod: PodStatus) -> EndpointState:
        """The scheduler's view of `pod`: the one built before while neither the pod nor this router's
        requests on it changed since."""
        return self.states_of((pod,))[0]

    def ready_states(self, model: str, pods: Sequence[PodStatus],
                     exclude: frozenset[str] = frozenset()) -> list[EndpointState]:
        """`states_of` the ready pods of `pods` serving `model`, in their order, minus `exclude`."""
        if exclude:  # a retry after a pod refused a connection: rare, and not the list kept
            return self.states_of([pod for pod in pods if _serves(pod, model) and pod.endpoint.pod.uid
                                   not in exclude])
        views = self._models.get(model)
        if views is None or len(views.pods) != len(pods):
            views = self._models[model] = _ModelViews(model, pods, self)
            return views.current()
        # Discovery's list compared in C (`==` tries identity first): the same list means that only
        # the pods this router's requests changed need a new view.
        if pods != views.pods:
            views.replace(pods, self)
        views.update(self)
        return views.current()

    def states_of(self, pods: Sequence[PodStatus]) -> list[EndpointState]:
        """`state_of` each pod. The check for a kept view is inlined in the loop: one method call per
        pod of a thousand-pod fleet was a third of building the views."""
        self._room = max(self._room, 2 * len(pods))
        kept_of, stamp_of, build = self._states.get, self._changed_at.get, self._build
        out = []
        for pod in pods:
            uid = pod.endpoint.pod.uid
            kept = kept_of(uid)
            stamp = stamp_of(uid, 0)
            out.append(kept[2] if kept is not None and kept[0] is pod and kept[1] == stamp
                       else build(pod, uid, stamp))
        return out

    def _build(self, pod: PodStatus, uid: str, stamp: int) -> EndpointState:
        """A new view of `pod`, kept under its change `stamp`."""
        requests = self.slot_requests(uid)  # one pass gives both the queues and the busy slots
        state = EndpointState(endpoint=pod.endpoint, busy_slots=frozenset(requests),
                              slot_last_used=self.last_used(uid), slot_requests=requests,
                              in_flight=self.count(uid), healthy=True)
        _make_room(self._states, uid, self._room)
        self._states[uid] = (pod, stamp, state)
        return state

    def _changed(self, uid: str) -> None:
        self._changes += 1
        if (forgotten := _make_room(self._changed_at, uid, self._room)) is not None:
            self._forget_view(forgotten)  # its stamp is gone: its kept view could not be checked
        self._changed_at[uid] = self._changes
        self._mark(uid)

    def _forget_view(self, uid: str) -> None:
        self._states.pop(uid, None)
        self._mark(uid)

    def _mark(self, uid: str) -> None:
        """Every model's kept list looks at the pod again on its next read."""
        for views in self._models.values():
            views.dirty.add(uid)


class _ModelViews:
    """The views of one model's ready pods as the last request got them: discovery's list, and per
    pod of it its view (None: not ready, or another model's), with the uids changed since (`dirty`)."""

    def __init__(self, model: str, pods: Sequence[PodStatus], books: InFlight) -> None:
        self.model = model
        self.pods = list(pods)
        self.dirty: set[str] = set()
        ready = [pod if _serves(pod, model) else None for pod in self.pods]
        built = iter(books.states_of([pod for pod in ready if pod is not None]))
        self.states: list[EndpointState | None] = [None if pod is None else next(built) for pod in ready]
        self.position = {pod.endpoint.pod.uid: i for i, pod in enumerate(self.pods)}
        self.missing = ready.count(None)

    def replace(self, pods: Sequence[PodStatus], books: InFlight) -> None:
        """Discovery's list changed in place (as long): the pods at the positions that differ."""
        moved = [i for i, (old, new) in enumerate(zip(self.pods, pods, strict=True)) if old is not new]
        for i in moved:  # every old uid first: a pod may have moved to another position
            self.position.pop(self.pods[i].endpoint.pod.uid, None)
        for i in moved:
            self.pods[i] = pods[i]
            self.position[pods[i].endpoint.pod.uid] = i
            self._view(i, books)

    def update(self, books: InFlight) -> None:
        """The pods this router's requests changed since the last read."""
        for uid in self.dirty:
            if (i := self.position.get(uid)) is not None:
                self._view(i, books)
        self.dirty.clear()

    def current(self) -> list[EndpointState]:
        if not self.missing:
            return list(self.states)  # type: ignore[arg-type]  # no None in it
        return [state for state in self.states if state is not None]

    def _view(self, i: int, books: InFlight) -> None:
        pod, was = self.pods[i], self.states[i]
        state = books.states_of((pod,))[0] if _serves(pod, self.model) else None
        self.states[i] = state
        self.missing += (state is None) - (was is None)


def _serves(pod: PodStatus, model: str) -> bool:
    """`pod.ready and pod.model == model`, without two property calls per pod of a thousand-pod fleet."""
    return pod.endpoint.ready and pod.props is not None and pod.props.model == model


def _make_room(book: dict[str, Any], uid: str, room: int) -> str | None:
    """Forget the oldest uid of a book of `room` uids before `uid` joins it (pods come and go, and a
    restarted pod has a new uid); the uid forgotten, if any."""
    if uid in book or len(book) < room:
        return None
    oldest = next(iter(book))
    del book[oldest]
    return oldest


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


def endpoint_states(
    model: str, pods: Sequence[PodStatus], in_flight: InFlight, exclude: frozenset[str] = frozenset()
) -> list[EndpointState]:
    """Ready pods serving `model` (minus `exclude`, pods that just refused a connection) as the
    scheduler's input."""
    states = in_flight.ready_states(model, pods, exclude)
    if not states:
        raise no_pod_available(model)
    return states


def props_for(model: str, pods: Sequence[PodStatus]) -> PodStatus | None:
    """A ready pod of `model` to take its chat template from (all replicas of a model share one)."""
    return next((pod for pod in pods if pod.ready and pod.model == model), None)


"""The request director: the one owner of a scheduled request's life in the gateway.

For each attempt it picks a slot (the scheduler), claims it (request/claim.py), runs the before-request
steps (the snapshot flow, when on), forwards the request and relays the answer, and leaves the
after-response work to the finisher (request/finish.py). A pod that refuses the connection before
anything was streamed is marked down and the request is picked again on the others, at most `retries`
times. Every path gives the attempt's slot back through its claim's one release.

Built whole by the app's lifespan (app.py), once its HTTP client, discovery and scheduler exist.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
from starlette.responses import Response

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.types import Action
from llamafleet_router.access.limits import Permit
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.discovery.base import Discovery, PodStatus
from llamafleet_router.errors import ApiError, no_pod_available
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight, endpoint_states
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.forward import forward, pinned_body
from llamafleet_router.proxy.gone import PodUnreachable, unless_gone
from llamafleet_router.proxy.relay import ErrorEvent, Outcome
from llamafleet_router.request.after import AfterResponse, SchedulerLike
from llamafleet_router.request.claim import Claims
from llamafleet_router.request.clock import RequestClock
from llamafleet_router.request.finish import Finisher
from llamafleet_router.scheduling.framework import (
    ANY_SLOT,
    DEGRADED_BRANCHES,
    Branch,
    Decision,
    EndpointState,
    NoEndpointError,
    SchedRequest,
)
from llamafleet_router.snapshots import SnapshotFlow

log = logging.getLogger(__name__)


def decision_headers(decision: Decision) -> dict[str, str]:
    """Where the request went and why: the pod's name, the slot and the action (for operators and tests)."""
    headers = {
        "x-llamafleet-pod": decision.endpoint.pod.name,
        "x-llamafleet-slot": str(decision.slot),
        "x-llamafleet-action": f"{decision.action.value}/{decision.branch}",
    }
    if decision.action is Action.RESTORE and decision.snapshot is not None:
        headers["x-llamafleet-snapshot"] = decision.snapshot.name
    return headers


def fallback_decision(states: Sequence[EndpointState]) -> Decision:
    """When even the scheduler could not decide because the index failed: the least loaded pod, any slot.
    No request fails because the index is unavailable."""
    state = min(states, key=lambda s: (s.load, len(s.busy_slots), s.uid))
    return Decision(state.endpoint, ANY_SLOT, Action.DIRECT, None, 0, Branch.DEGRADED_FALLBACK)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What goes to the pod whatever the slot: the route's path, the client's checked body, encoded
    (`encoded_body`; pinned to the slot when sent), what the client accepts, and how a stream cut
    midway ends (the route's API)."""

    path: str
    encoded: bytes
    accept: str
    error_event: ErrorEvent


@dataclass(frozen=True, slots=True)
class Upstream:
    """How the gateway talks to pods: its client, the headers every forwarded request carries (the
    pods' own key), and the bound on a buffered answer."""

    http: httpx.AsyncClient
    pod_headers: dict[str, str] = field(default_factory=dict)
    max_response_bytes: int | None = None


@dataclass(frozen=True)
class Director:
    upstream: Upstream
    discovery: Discovery
    scheduler: SchedulerLike
    after: AfterResponse
    claims: Claims
    snapshots: SnapshotFlow | None
    in_flight: InFlight
    owners: ModelOwners
    tenancy: Tenancy
    metrics: RouterMetrics
    health: IndexHealth
    tasks: TaskSet
    retries: int

    async def pods(self, model: str) -> list[PodStatus]:
        """The pods of the fleet that serves `model` (503 for a name two fleets claim)."""
        return self.owners.pick(model, await self.discovery.endpoints())

    async def run(
        self, req: SchedRequest, outgoing: Outgoing, key: str, permit: Permit | None, clock: RequestClock,
    ) -> Response:
        """Answer `req`. The finisher of the answered attempt releases `permit` when its response ends."""
        excluded: set[str] = set()
        moved_from: str | None = None  # the pod a first-sight waiter left (at most once)
        attempt = 0
        while attempt <= self.retries:
            pods = await self.pods(req.model)
            if self.snapshots is not None:
                await self.snapshots.resync.ensure(pods)  # a pod seen at a new epoch: re-record its snapshots
            try:
                states = endpoint_states(req.model, pods, self.in_flight, frozenset(excluded))
            except ApiError:
                if moved_from not in excluded:
                    raise
                excluded.discard(moved_from)  # the idle pod it moved for is gone: back to the build's
                continue
            decision = await self._pick(req, states)
            claim = self.claims.claim(decision)
            give_up = self.discovery.gone(decision.endpoint.uid)
            finish: Finisher | None = None
            recorded: asyncio.Task[None] | None = None
            try:
                if self.snapshots is not None:
                    # A restore or first-sight prefill waits on the pod too: give up if it hangs.
                    prepared = self.snapshots.prepare(req, decision, pods, may_move=moved_from is None)
                    claim.update(await unless_gone(give_up, prepared))
                    if claim.decision.branch == Branch.FIRST_SIGHT_MOVED:
                        # A pod with an idle slot computes the head before the build this request
                        # waited for on its own pod ends: schedule it again, without that pod.
                        claim.release()
                        moved_from = decision.endpoint.uid
                        excluded.add(moved_from)
                        log.info("first-sight waiter moves off the building pod",
                                 extra={"pod": decision.endpoint.url})
                        continue
                recorded = self.tasks.spawn(self.after.dispatched(req, claim.decision),
                                            name="record-dispatched")
                finish = Finisher(req, claim, key, self.after, self.metrics, self.tasks, self.snapshots,
                                  permit=permit, clock=clock)
                return await forward(
                    self.upstream.http, decision.endpoint.url + outgoing.path,
                    pinned_body(outgoing.encoded, decision.slot),
                    {"content-type": "application/json", "accept": outgoing.accept,
                     "accept-encoding": "identity", "x-request-id": req.request_id,
                     **self.upstream.pod_headers},
                    on_finish=finish, on_first_byte=self._on_first_byte(req),
                    extra_headers=self._routing_headers(key, claim.decision),
                    give_up=give_up, max_response_bytes=self.upstream.max_response_bytes,
                    error_event=outgoing.error_event,
                    on_answer_start=lambda: clock.answer_started(req.model, key),
                )
            except PodUnreachable as exc:
                if finish is not None:
                    finish.disarm()  # nothing was forwarded: give back without counting a response
                claim.release()
                if recorded is not None:
                    self.tasks.spawn(self.after.withdrawn(req, claim.decision, recorded),
                                     name="withdraw-dispatched")
                self.discovery.mark_down(decision.endpoint.uid)
                excluded.add(decision.endpoint.uid)
                self.metrics.upstream_retries.inc()
                log.warning("pod unreachable, scheduling again",
                            extra={"pod": decision.endpoint.url, "attempt": attempt, "error": str(exc)})
                attempt += 1
            except ApiError as err:
                err.counted = True  # forward() reported it through on_finish already
                raise
            except BaseException:
                if finish is None:  # cancelled (client gone) while a snapshot step ran
                    claim.release()
                else:
                    finish(Outcome(status=500, error="router error"), None)
                raise
        raise no_pod_available(req.model)

    async def _pick(self, req: SchedRequest, states: list[EndpointState]) -> Decision:
        started = time.perf_counter()
        try:
            decision = await self.scheduler.schedule(req, states)
        except NoEndpointError:
            raise no_pod_available(req.model) from None
        except IndexUnavailable as exc:
            self.health.mark_degraded(f"schedule: {exc}")
            decision = fallback_decision(states)
        self.metrics.schedule_seconds.observe(time.perf_counter() - started)
        self.metrics.decisions.labels(decision.action.value, decision.branch).inc()
        if decision.branch in DEGRADED_BRANCHES:
            self.health.mark_degraded("the scheduler fell back to degraded routing")
        return decision

    def _routing_headers(self, key: str, decision: Decision) -> dict[str, str] | None:
        return decision_headers(decision) if self.tenancy.routing_headers(key) else None

    def _on_first_byte(self, req: SchedRequest) -> Callable[[float], None]:
        observe = self.metrics.upstream_ttft_seconds.labels(req.model).observe
        flow, request_id = self.snapshots, req.request_id
        if flow is None:
            return observe

        def first_byte(seconds: float) -> None:
            observe(seconds)
            flow.request_answering(request_id)  # a build detached from this request may start

        return first_byte

"""The inference routes: authenticate, read and check the body, render the prompt identity, schedule,
proxy, and hand the rest to the after-response hook.

A pod that refuses the connection before anything was streamed is marked down and the request is
scheduled again on the others (at most `retries` times). Every error the router answers itself is a
4xx in the shape of the route's API (`error_shapes.py`), except 503 when pods exist but none can
take the request. `/v1/messages/count_tokens` and `/v1/embeddings` skip the scheduler (`direct.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
from starlette.requests import Request
from starlette.responses import Response

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.types import Action
from llamafleet_router.access.auth import ANONYMOUS, ApiKeys, authenticate
from llamafleet_router.access.limits import KeyLimiter, LimitConfig, Permit
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.api.clock import RequestClock
from llamafleet_router.api.direct import answer_direct
from llamafleet_router.api.embeddings import EmbeddingPods
from llamafleet_router.api.error_shapes import error_event_for, error_response
from llamafleet_router.api.fields import FieldPolicy
from llamafleet_router.api.limited import admit
from llamafleet_router.api.parse import (
    DIRECT_ROUTES,
    ParsedRequest,
    Route,
    parse_request,
    read_body,
    upstream_body,
)
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.discovery.base import Discovery
from llamafleet_router.errors import ApiError, ClientGone, no_pod_available
from llamafleet_router.fleet.leases import ReplicaLeases
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight, endpoint_states, props_for, resolve_model
from llamafleet_router.logs import request_id_var
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.forward import forward
from llamafleet_router.proxy.gone import PodUnreachable, unless_gone
from llamafleet_router.request.after import AfterResponse, Outcome, SchedulerLike
from llamafleet_router.request.prompts import PromptRenderer
from llamafleet_router.scheduling.framework import (
    ANY_SLOT,
    Branch,
    Decision,
    EndpointState,
    NoEndpointError,
    SchedRequest,
)
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots import SnapshotConfig, SnapshotFlow, SnapshotMetrics
from llamafleet_router.snapshots.detached import Borrowed

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


def fallback_decision(states: list[EndpointState]) -> Decision:
    """When even the scheduler could not decide because the index failed: the least loaded pod, any slot.
    No request fails because the index is unavailable."""
    state = min(states, key=lambda s: (s.load, len(s.busy_slots), s.uid))
    return Decision(state.endpoint, ANY_SLOT, Action.DIRECT, None, 0, Branch.DEGRADED_FALLBACK)


@dataclass
class _Finisher:
    """Gives back one request's bookkeeping exactly once, synchronously, however the response ended."""

    gateway: Gateway
    req: SchedRequest
    decision: Decision
    key: str
    started: float
    done: bool = field(default=False)
    permit: Permit | None = field(default=None)  # the key's place in its in-flight limit
    clock: RequestClock | None = field(default=None)  # the client-side timings, from the arrival

    def __call__(self, outcome: Outcome, close: Callable[[], Awaitable[None]] | None) -> None:
        if self.done:
            return
        self.done = True
        if self.permit is not None:
            self.permit.release()
        g, d = self.gateway, self.decision
        g.in_flight.end(d.endpoint.uid, d.endpoint.url, d.slot)
        if g._snapshots is not None:
            g._snapshots.request_answering(self.req.request_id)  # ended without answering, maybe
        if g.leases is not None and d.lease_holder is not None:
            g.leases.relinquish(d.slot_ref, d.lease_holder)
        g.metrics.requests.labels(self.req.model, self.key, str(outcome.status)).inc()
        if self.clock is not None:
            self.clock.finished(self.req.model, self.key, outcome)
        if outcome.error:
            g.metrics.stream_errors.inc()
        if outcome.disconnected:
            g.metrics.client_disconnects.inc()
        stats = outcome.stats
        log.info("request finished", extra={
            "model": self.req.model, "key": self.key, "status": outcome.status, "pod": d.endpoint.url,
            "slot": d.slot, "action": d.action.value, "branch": d.branch,
            "predicted_blocks": d.predicted_blocks,
            "cache_n": stats.cache_n if stats else None, "prompt_n": stats.prompt_n if stats else None,
            "disconnected": outcome.disconnected, "error": outcome.error,
            "seconds": round(time.perf_counter() - self.started, 4),
        })
        assert g.after is not None
        g.tasks.spawn(g.after.finished(self.req, d, outcome, close), name="after-response")


class Gateway:
    """The app's request handling; its collaborators are set by `create_app` and its lifespan."""

    def __init__(
        self, *, keys: ApiKeys, metrics: RouterMetrics, prompts: PromptRenderer, health: IndexHealth,
        max_body_bytes: int, retries: int, body_timeout_s: float | None = None,
        max_response_bytes: int | None = None, limiter: KeyLimiter | None = None,
        owners: ModelOwners | None = None, tenancy: Tenancy | None = None,
        fields: FieldPolicy | None = None,
    ) -> None:
        self.keys = keys
        self.fields = fields if fields is not None else FieldPolicy()  # what a body may carry to a pod
        self.owners = owners if owners is not None else ModelOwners()  # which fleet serves a model name
        self.tenancy = tenancy if tenancy is not None else Tenancy(auth_enabled=keys.enabled)
        self.metrics = metrics
        self.prompts = prompts
        self.health = health
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_response_bytes = max_response_bytes
        self.limiter = limiter if limiter is not None else KeyLimiter(LimitConfig())  # per-key limits
        self.retries = retries
        # Sent to the pods with every forwarded request: llama-server's own key, when they run with one.
        self.pod_headers: dict[str, str] = {}
        self.tasks = TaskSet()
        self.in_flight = InFlight(metrics)
        self.embedding_pods = EmbeddingPods()  # pods that said they run without `--embeddings`
        # Set in the lifespan (they need the app's HTTP client or are built from it).
        self.http: httpx.AsyncClient | None = None
        self.discovery: Discovery | None = None
        self.scheduler: SchedulerLike | None = None
        self.leases: ReplicaLeases | None = None  # when the app built the scheduler itself
        self.after: AfterResponse | None = None
        self.speeds: SpeedBook | None = None  # the scheduler's learned per-pod speeds, when it has them
        # Snapshots (restore-on-miss, first sight): on when `enable_snapshots` was given a config.
        self.snapshot_config: SnapshotConfig | None = None
        self.snapshot_metrics: SnapshotMetrics | None = None
        self._snapshots: SnapshotFlow | None = None

    def enable_snapshots(self, config: SnapshotConfig | None) -> None:
        """Turn the snapshot flow on (`SnapshotConfig.from_settings(settings)`; None leaves it off).
        Its metrics register on the app's registry now; the flow itself is built at first use, once
        the lifespan has set the HTTP client and the index."""
        if config is None or self.snapshot_config is not None:
            return
        self.snapshot_config = config
        self.snapshot_metrics = SnapshotMetrics(self.metrics.registry)

    @property
    def snapshots(self) -> SnapshotFlow | None:
        config, metrics = self.snapshot_config, self.snapshot_metrics
        ready = self.http is not None and self.after is not None
        if self._snapshots is None and config is not None and metrics is not None and ready:
            assert self.http is not None and self.after is not None
            self._snapshots = SnapshotFlow(
                http=self.http, index=self.after.index, config=config, metrics=metrics, tasks=self.tasks,
                speeds=self.speeds,
            )
            # A Redis that comes back empty lost the snapshot entries; the agents still hold the files.
            self.health.on_recovered.append(self._snapshots.resync.forget_all)
            self._snapshots.borrow = self._borrow_slot
        return self._snapshots

    def _on_first_byte(self, req: SchedRequest) -> Callable[[float], None]:
        observe = self.metrics.upstream_ttft_seconds.labels(req.model).observe
        flow, request_id = self._snapshots, req.request_id
        if flow is None:
            return observe

        def first_byte(seconds: float) -> None:
            observe(seconds)
            flow.request_answering(request_id)  # a build detached from this request may start

        return first_byte

    async def _borrow_slot(
        self, req: SchedRequest, *, pod_uid: str | None = None, min_idle: int = 1,
        avoid: frozenset[int] = frozenset(),
    ) -> Borrowed | None:
        """An idle slot for a background build, leased and counted in flight like a request's, so no
        request is pinned to it meanwhile; None when there is none (the caller builds in its own slot).
        With `pod_uid`, on that pod only, and only while it has `min_idle` idle slots; never one of the
        slots in `avoid` (they count as idle: requests may take them)."""
        assert self.discovery is not None and self.scheduler is not None and self.after is not None
        build = SchedRequest(f"{req.request_id}/build", req.model, req.prompt, None)
        pods = [p for p in await self.discovery.endpoints() if pod_uid is None or p.endpoint.uid == pod_uid]
        try:
            states = endpoint_states(req.model, self.owners.pick(req.model, pods), self.in_flight)
            roomy = [s for s in states if len(s.idle_slots) >= min_idle]
            states = [dataclasses.replace(s, busy_slots=s.busy_slots | avoid) if avoid else s for s in roomy]
            if not states:
                return None
            decision = await self.scheduler.schedule(build, states)
        except (NoEndpointError, IndexUnavailable, ApiError):  # ApiError: no pod, or a model conflict
            return None
        after = self.after
        queued = decision.branch is Branch.QUEUED
        if decision.slot == ANY_SLOT or queued or decision.endpoint.agent_url is None:
            await after.release(decision)
            return None
        uid, url, slot = decision.endpoint.uid, decision.endpoint.url, decision.slot
        self.in_flight.begin(uid, url, slot)

        async def give_back() -> None:
            self.in_flight.end(uid, url, slot)
            await after.release(decision)

        return decision, give_back

    async def infer(self, request: Request, route: Route) -> Response:
        key, model = ANONYMOUS, "unknown"
        permit: Permit | None = None
        clock = RequestClock(self.metrics)  # the client's wait starts now, before the body is read
        try:
            key = authenticate(self.keys, request.headers)
            parsed = parse_request(route, await read_body(request, self.max_body_bytes, self.body_timeout_s))
            parsed = self.fields.check(parsed, key)  # 400: a field off the allow-list or a bound, a bad shape
            permit = admit(self.limiter, key, route, parsed.body)  # 429 past the key's own limits
            assert self.discovery is not None, "the app's lifespan has not run"
            pods = await self.discovery.endpoints()
            self.metrics.pods_up.set(sum(pod.ready for pod in pods))
            model = resolve_model(parsed.model, pods)
            pods = self.owners.pick(model, pods)  # 503 for a name two fleets claim
            if route in DIRECT_ROUTES:  # generates nothing: a pod of the model, no slot, no scheduling
                accept = request.headers.get("accept", "*/*")
                permit, held = None, permit
                return await answer_direct(self, accept, parsed, model, pods, key, held)
            source = props_for(model, pods)
            parsed = self.fields.forwarded(parsed, key, source.props if source else None)  # media, length
            identity = self.prompts.identity(parsed, model, source.props if source else None,
                                             self.tenancy.namespace(key))
            req = SchedRequest(request_id_var.get() or "", model, identity, parsed.session_id)
            response = await self._dispatch(request, req, parsed, key, permit, clock)
            permit = None  # the response's finisher gives it back, when the response ends
            return response
        except ApiError as err:
            if not err.counted:
                self.metrics.requests.labels(model, key, str(err.status)).inc()
            if isinstance(err, ClientGone):
                self.metrics.client_disconnects.inc()
            log.info("request refused", extra={"status": err.status, "code": err.code, "key": key,
                                               "model": model})
            return error_response(err, route)  # Anthropic-shaped on the Anthropic routes
        finally:
            if permit is not None:
                permit.release()  # refused, failed or cancelled before any response

    async def _schedule(self, req: SchedRequest, states: list[EndpointState]) -> Decision:
        assert self.scheduler is not None
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
        if decision.branch.degraded:
            self.health.mark_degraded("the scheduler fell back to degraded routing")
        return decision

    async def _dispatch(
        self, request: Request, req: SchedRequest, parsed: ParsedRequest, key: str,
        permit: Permit | None = None, clock: RequestClock | None = None,
    ) -> Response:
        assert self.discovery is not None and self.http is not None and self.after is not None
        clock = clock if clock is not None else RequestClock(self.metrics)
        excluded: set[str] = set()
        snapshots = self.snapshots
        for attempt in range(self.retries + 1):
            pods = self.owners.pick(req.model, await self.discovery.endpoints())
            if snapshots is not None:
                await snapshots.resync.ensure(pods)  # a pod seen at a new epoch: re-record its snapshots
            decision = await self._schedule(req, endpoint_states(req.model, pods, self.in_flight,
                                                                 frozenset(excluded)))
            uid, url = decision.endpoint.uid, decision.endpoint.url
            gone = getattr(self.discovery, "gone", None)
            give_up = gone(uid) if gone is not None else None
            self.in_flight.begin(uid, url, decision.slot)
            finish: _Finisher | None = None
            try:
                if snapshots is not None:
                    # A restore or first-sight prefill waits on the pod too: give up if it hangs.
                    decision = await unless_gone(give_up, snapshots.prepare(req, decision, pods))
                self.tasks.spawn(self.after.dispatched(req, decision), name="record-dispatched")
                finish = _Finisher(self, req, decision, key, time.perf_counter(), permit=permit, clock=clock)
                return await forward(
                    self.http, url + parsed.route.value, upstream_body(parsed.body, decision.slot),
                    {"content-type": "application/json", "accept": request.headers.get("accept", "*/*"),
                     "accept-encoding": "identity", "x-request-id": req.request_id, **self.pod_headers},
                    on_finish=finish,
                    on_first_byte=self._on_first_byte(req),
                    extra_headers=decision_headers(decision) if self.tenancy.routing_headers(key) else None,
                    give_up=give_up, max_response_bytes=self.max_response_bytes,
                    error_event=error_event_for(parsed.route),
                    on_answer_start=lambda: clock.answer_started(req.model, key),
                )
            except PodUnreachable as exc:
                if finish is not None:
                    finish.done = True  # nothing was forwarded: give back without counting a response
                self.in_flight.end(uid, url, decision.slot)
                self.tasks.spawn(self.after.release(decision), name="release")
                self.discovery.mark_down(uid)
                excluded.add(uid)
                self.metrics.upstream_retries.inc()
                log.warning("pod unreachable, scheduling again",
                            extra={"pod": url, "attempt": attempt, "error": str(exc)})
            except ApiError as err:
                err.counted = True  # forward() reported it through on_finish already
                raise
            except BaseException:
                if finish is None:  # cancelled (client gone) while restoring or prefilling
                    self.in_flight.end(uid, url, decision.slot)
                    self.tasks.spawn(self.after.release(decision), name="release")
                else:
                    finish(Outcome(status=500, error="router error"), None)
                raise
        raise no_pod_available(req.model)

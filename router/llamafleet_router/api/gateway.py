"""The inference routes: authenticate, read and check the body, admit it under the key's limits,
resolve the model and render the prompt identity, then hand the request to its director
(request/director.py), which schedules, prepares the slot, forwards and finishes it.

Every error the router answers itself is a 4xx in the shape of the route's API (`error_shapes.py`),
except 503 when pods exist but none can take the request. `/v1/messages/count_tokens` and
`/v1/embeddings` skip the scheduler (`direct.py`).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from llamafleet_router.access.auth import ANONYMOUS, ApiKeys, authenticate
from llamafleet_router.access.limits import KeyLimiter, LimitConfig, Permit
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.api.direct import answer_direct
from llamafleet_router.api.embeddings import EmbeddingPods
from llamafleet_router.api.error_shapes import error_event_for, error_response
from llamafleet_router.api.fields import FieldPolicy
from llamafleet_router.api.known_tools import ToolSpans
from llamafleet_router.api.limited import admit
from llamafleet_router.api.parse import DIRECT_ROUTES, ParsedRequest, Route, parse_request, read_body
from llamafleet_router.api.prompts import PromptRenderer
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.discovery.base import Discovery
from llamafleet_router.errors import ApiError, ClientGone
from llamafleet_router.fleet.leases import ReplicaLeases
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight, props_for, resolve_model
from llamafleet_router.logs import request_id_var
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.forward import encoded_body
from llamafleet_router.request.clock import RequestClock
from llamafleet_router.request.director import Director, Outgoing
from llamafleet_router.scheduling.framework import SchedRequest
from llamafleet_router.snapshots import SnapshotConfig, SnapshotFlow, SnapshotMetrics

log = logging.getLogger(__name__)


class Gateway:
    """The app's request handling: the checks before a request has a director, and the director, set
    by the lifespan (`start`)."""

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
        self.tool_spans = ToolSpans()  # tool lists found by their bytes in later requests
        metrics.known_tool_lists.set_function(self.tool_spans.__len__)
        # Snapshots (restore-on-miss, first sight): on when `enable_snapshots` was given a config.
        self.snapshot_config: SnapshotConfig | None = None
        self.snapshot_metrics: SnapshotMetrics | None = None
        self._director: Director | None = None  # built whole by the lifespan, once it has a client

    def enable_snapshots(self, config: SnapshotConfig | None) -> None:
        """Turn the snapshot flow on (`SnapshotConfig.from_settings(settings)`; None leaves it off).
        Its metrics register on the app's registry now; the flow itself is built with the director,
        by the lifespan, once it has the HTTP client and the index."""
        if config is None or self.snapshot_config is not None:
            return
        self.snapshot_config = config
        self.snapshot_metrics = SnapshotMetrics(self.metrics.registry)

    @property
    def director(self) -> Director:
        """The request director, built whole by the app's lifespan (`start`)."""
        if self._director is None:
            raise RuntimeError("the app's lifespan has not run")
        return self._director

    def start(self, director: Director) -> None:
        self._director = director

    # What the running director holds, for embedding code and tests (None before the lifespan ran).
    @property
    def discovery(self) -> Discovery | None:
        return self._director.discovery if self._director is not None else None

    @property
    def snapshots(self) -> SnapshotFlow | None:
        return self._director.snapshots if self._director is not None else None

    @property
    def leases(self) -> ReplicaLeases | None:
        return self._director.claims.leases if self._director is not None else None

    async def infer(self, request: Request, route: Route) -> Response:
        key, model = ANONYMOUS, "unknown"
        permit: Permit | None = None
        clock = RequestClock(self.metrics)  # the client's wait starts now, before the body is read
        try:
            key = authenticate(self.keys, request.headers)
            raw = await read_body(request, self.max_body_bytes, self.body_timeout_s)
            parsed = parse_request(route, raw, self.tool_spans, self.tenancy.namespace(key))
            del raw
            if parsed.known_tools is not None:
                self.metrics.known_tools_reused.inc()
            parsed = self.fields.check(parsed, key)  # 400: a field off the allow-list or a bound, a bad shape
            permit = admit(self.limiter, key, route, parsed.body)  # 429 past the key's own limits
            director = self.director
            pods = await director.discovery.endpoints()
            self.metrics.pods_up.set(sum(pod.ready for pod in pods))
            model = resolve_model(parsed.model, pods)
            pods = self.owners.pick(model, pods)  # 503 for a name two fleets claim
            if route in DIRECT_ROUTES:  # generates nothing: a pod of the model, no slot, no scheduling
                accept = request.headers.get("accept", "*/*")
                permit, held = None, permit
                return await answer_direct(director, self.embedding_pods, accept, parsed, model, pods, key,
                                           held)
            source = props_for(model, pods)
            parsed = self.fields.forwarded(parsed, key, source.props if source else None)  # media, length
            identity = self.prompts.identity(parsed, model, source.props if source else None,
                                             self.tenancy.namespace(key))
            req = SchedRequest(request_id_var.get() or "", model, identity, parsed.session_id)
            outgoing = Outgoing(parsed.route.value, encoded_body(parsed.body, _verbatim(parsed)),
                                request.headers.get("accept", "*/*"), error_event_for(parsed.route))
            del parsed  # not held while the pod computes: `encoded_body` says why
            response = await director.run(req, outgoing, key, permit, clock)
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


def _verbatim(parsed: ParsedRequest) -> dict[str, bytes] | None:
    """The learned tools' bytes, forwarded as the client wrote them, while the body still holds them."""
    known = parsed.known_tools
    return {"tools": known.raw} if known is not None and parsed.body.get("tools") is known.value else None

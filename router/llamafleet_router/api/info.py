"""The routes that are not inference: `/health`, `/metrics` (`/v1/models` is `models.py`'s), and
errors for everything else (unknown paths, llama-server admin paths, wrong methods, unexpected
failures): OpenAI-shaped, Anthropic-shaped on the Anthropic routes.

`/health` and `/metrics` show pod addresses, uids, busy slots, key names and per-key traffic. On the
client port only admin keys see them (`tenancy.py`): `/health` answers everyone else `{"status"}` alone
(200 or 503: what probes and load balancers need), `/metrics` answers 401 or 403. The `metrics_port`
listener (`unlocked=True`) serves both in full without a key: it is for Prometheus and probes, and the
chart never puts it behind the Service clients use. `/openapi.json` stays public: it describes the
API, and holds no state."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llamafleet_router.access.auth import authenticate
from llamafleet_router.api.error_shapes import error_response
from llamafleet_router.api.gateway import Gateway
from llamafleet_router.api.parse import Route as ParseRoute
from llamafleet_router.errors import AUTHENTICATION, NOT_FOUND, SERVER, ApiError

log = logging.getLogger(__name__)


#: An extra readiness condition from whoever embeds the gateway (the local runtime: "every pod up and
#: every SharedPrefix warm"): returns (ready, details for the /health body).
Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


class InfoRoutes:
    def __init__(
        self, gateway: Gateway, readiness: Readiness | None = None, *, unlocked: bool = False
    ) -> None:
        self.gateway = gateway
        self.readiness = readiness
        self.unlocked = unlocked  # the metrics port: details without a key

    def _admin(self, request: Request) -> bool:
        """Whether the caller may see the details (a missing or wrong key: no, never a 401 here)."""
        if self.unlocked:
            return True
        try:
            key = authenticate(self.gateway.keys, request.headers)
        except ApiError:
            return False
        return self.gateway.tenancy.is_admin(key)

    async def health(self, request: Request) -> Response:
        """200 when at least one pod is ready; the body says which pods are up and how the index is."""
        g = self.gateway
        pods = await g.director.discovery.endpoints()
        ready = sum(pod.ready for pod in pods)
        g.metrics.pods_up.set(ready)
        conflicts = g.owners.conflicts(pods)
        g.metrics.model_conflicts.set(len(conflicts))
        body: dict[str, Any] = {
            "status": "ok" if ready else "unavailable",
            "index": "degraded" if g.health.degraded else "ok",
            "pods_up": ready,
            "pods_down": len(pods) - ready,
            "pods": [
                {"url": pod.endpoint.url, "uid": pod.endpoint.uid if pod.props else None, "model": pod.model,
                 "up": pod.ready, "slots": pod.endpoint.n_slots, "attach": pod.endpoint.attach,
                 "cachePrefix": pod.endpoint.cache_prefix,
                 "busy_slots": sorted(pod.busy_slots),
                 "in_flight": g.in_flight.count(pod.endpoint.uid)}
                for pod in pods
            ],
            # Model names several fleets report, unmapped: refused until `model_fleets` says (ownership.py).
            "model_conflicts": conflicts,
        }
        ok = bool(ready)
        if self.readiness is not None:
            extra_ok, details = await self.readiness()
            body["fleet"] = details
            ok = ok and extra_ok
            body["status"] = "ok" if ok else "unavailable"
        if not self._admin(request):
            body = {"status": body["status"]}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        g = self.gateway
        if not self.unlocked:
            try:
                key = authenticate(g.keys, request.headers)
            except ApiError as err:
                return err.response()
            if not g.tenancy.is_admin(key):
                return ApiError(403, "/metrics needs an admin key (the gateway's `admin_keys`).",
                                type=AUTHENTICATION, code="admin_key_required").response()
        discovery = g.discovery  # None while the app has not started: no pods to show yet
        if discovery is not None:
            pods = await discovery.endpoints()
            g.metrics.model_conflicts.set(len(g.owners.conflicts(pods)))
            g.metrics.show_slot_contexts(pods)  # as of this scrape, traffic or none
        return Response(generate_latest(g.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def http_error(request: Request, exc: Exception) -> Response:
    """404/405 and friends in OpenAI's shape. Admin paths of llama-server land here too: never proxied."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = ApiError(404, f"Invalid URL ({request.method} {request.url.path})", type=NOT_FOUND,
                       code="unknown_url")
    elif exc.status_code == 405:
        err = ApiError(405, f"Method {request.method} is not allowed on {request.url.path}.",
                       code="method_not_allowed")
    else:
        err = ApiError(exc.status_code, str(exc.detail))
    return error_response(err, _route(request), dict(exc.headers or {}))


async def server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    err = ApiError(500, "The gateway failed to handle the request.", type=SERVER, code="internal_error")
    return error_response(err, _route(request))


def _route(request: Request) -> ParseRoute | None:
    """The inference route of the request's path (its errors take that API's shape), if it is one."""
    try:
        return ParseRoute(request.url.path)
    except ValueError:
        return None

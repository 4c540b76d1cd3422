"""A gateway over a fake pod, served by uvicorn in a thread of its own, for synchronous fuzzers.

schemathesis and hypothesis drive requests synchronously; the gateway and the fake pod run on their own
event loop in a background thread, on loopback ports, so the real proxy path (aiohttp upstream, SSE
relay) is what gets fuzzed. `on_loop(fn)` reads the gateway's state on its own loop (leak checks).

The gateway's HTTP client marks what it sends outside any client request (`fake_pod.BACKGROUND`): the
fake pod can then tell discovery's own polls from anything a client's request made the gateway send,
without trusting paths (a forwarded `GET /slots` looks just like a poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_router.app import create_app
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.settings import RouterSettings
from llamafleet_router.transport import HeadBounds, bounded_protocol
from tests.fuzz.fake_pod import BACKGROUND, FAKE_FIELDS, Hit, Stream, fake_pod

T = TypeVar("T")
API_KEY = "fuzz-secret-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Set for the whole handling of one client request, and inherited by the tasks it starts.
_IN_CLIENT_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("in_client_request", default=False)


def mark_background(http: httpx.AsyncClient) -> httpx.AsyncClient:
    """Have `http`, the app's own client (the proxy's too), mark every request it sends outside a client
    request: discovery's polls. A request sent with it while handling a client request stays unmarked."""
    async def mark(request: httpx.Request) -> None:
        if not _IN_CLIENT_REQUEST.get():
            request.headers[BACKGROUND] = "1"

    http.event_hooks = {**http.event_hooks, "request": [*http.event_hooks["request"], mark]}
    return http


def client_requests_marked(app: ASGIApp) -> ASGIApp:
    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            _IN_CLIENT_REQUEST.set(True)  # this task's context only: uvicorn runs each request in a task
        await app(scope, receive, send)

    return marked


def gateway_settings(pod_url: str, *, max_body_bytes: int = 256 * 1024, **overrides: Any) -> RouterSettings:
    """The served gateway's settings; `overrides` are any other RouterSettings fields. The fake pod's
    own fields (`FAKE_FIELDS`) are allowed through, as an operator allows llama-server's. The fuzzers'
    key is an admin key: the surface tests read the routing headers (`x-llamafleet-slot`)."""
    fields: dict[str, Any] = {"pods": [pod_url], "poll_interval": 0.2, "max_body_bytes": max_body_bytes,
                              "api_keys": SecretStr(f"fuzz:{API_KEY}"), "extra_fields": list(FAKE_FIELDS),
                              "admin_keys": ["fuzz"], **overrides}
    return RouterSettings(**fields)


def gateway_app(pod_url: str, **kwargs: Any) -> Starlette:
    return app_for(gateway_settings(pod_url, **kwargs))


def app_for(settings: RouterSettings) -> Starlette:
    app = create_app(
        settings, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(),
        discovery=lambda http, fence: StaticDiscovery(settings.pod_specs, mark_background(http),
                                                      poll_interval=0.2, fence=fence, startup_timeout=5.0),
    )
    return app


@dataclass
class Served:
    url: str = ""
    pod_url: str = ""
    app: Any = None
    settings: RouterSettings | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)  # every request the fake pod was asked
    streams: list[Stream] = field(default_factory=list)  # the fake pod's long streams (`fake_events`)
    loop: asyncio.AbstractEventLoop | None = None

    def on_loop(self, fn: Callable[[], T]) -> T:
        assert self.loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def leaks(self) -> tuple[int, int]:
        """(requests in flight, slot leases held) once every request has finished: both must be 0."""
        gateway = self.app.state.gateway

        def read() -> tuple[int, int]:
            return gateway.in_flight.total(), gateway.leases.held() if gateway.leases else 0

        for _ in range(100):  # after-response work finishes a moment after the client got its answer
            counts = self.on_loop(read)
            if counts == (0, 0):
                return counts
            threading.Event().wait(0.02)
        return counts


@contextlib.contextmanager
def served_gateway(pod: ASGIApp | None = None, **kwargs: Any) -> Iterator[Served]:
    """The gateway over the fake pod, or over `pod` (any ASGI app served as the pod: a proxy to a real
    llama-server), with `kwargs` as settings overrides (`gateway_settings`)."""
    served = Served()
    ready, stop = threading.Event(), None
    errors: list[BaseException] = []

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        served.loop = asyncio.get_running_loop()
        try:
            app = pod if pod is not None else fake_pod(served.received, served.hits, served.streams)
            async with serve(app) as pod_url:
                served.pod_url = pod_url
                settings = served.settings = gateway_settings(pod_url, **kwargs)
                served.app = app_for(settings)
                # As `llamafleet router` serves it: request heads bounded by the settings (transport.py).
                protocol = bounded_protocol(HeadBounds.from_settings(settings))
                async with serve(client_requests_marked(served.app), http=protocol) as url:
                    served.url = url
                    ready.set()
                    await stop.wait()
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    if errors:
        raise errors[0]
    try:
        yield served
    finally:
        assert served.loop is not None and stop is not None
        served.loop.call_soon_threadsafe(stop.set)
        thread.join(30)

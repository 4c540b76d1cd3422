"""The `metrics_port` listener: `/metrics` and the detailed `/health` without a key, beside the client port.

Prometheus and the kubelet's probes cannot present an API key from a Secret the way a client does, and
what those routes show (pod addresses, busy slots, key names and traffic) is not for clients. So they
get their own port, which the chart leaves out of the Service and the Ingress clients use.

It opens once the client port listens (a probe that passes here means the gateway answers clients
too) and closes when the client server stops. It installs no signal handlers: the client server owns
SIGINT/SIGTERM, and its end ends this one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import ASGIApp

from llamafleet_router.settings import RouterSettings
from llamafleet_router.transport import uvicorn_options


class _Quiet(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _when_started(main: uvicorn.Server, server: uvicorn.Server) -> None:
    while not main.started:  # uvicorn has no start event to await
        if main.should_exit or server.should_exit:
            return
        await asyncio.sleep(0.05)
    await server.serve()


@contextlib.asynccontextmanager
async def metrics_port(main: uvicorn.Server, app: ASGIApp, settings: RouterSettings) -> AsyncIterator[None]:
    """Serve `app` on `settings.metrics_port` while `main` runs inside this context (nothing when the
    port is unset)."""
    if settings.metrics_port is None:
        yield
        return
    config = uvicorn.Config(app, host=settings.host, port=settings.metrics_port, log_config=None,
                            lifespan="off", proxy_headers=False, access_log=False,
                            timeout_graceful_shutdown=1, **uvicorn_options(settings))
    server = _Quiet(config)
    task = asyncio.create_task(_when_started(main, server), name="metrics-port")
    try:
        yield
    finally:
        server.should_exit = True
        await task

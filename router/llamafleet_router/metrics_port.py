"""The `metrics_port` listener: `/metrics` and the detailed `/health` without a key, beside the client port.

Prometheus and the kubelet's probes cannot present an API key from a Secret the way a client does, and
what those routes show (pod addresses, busy slots, key names and traffic) is not for clients. So they
get their own port, which the chart leaves out of the Service and the Ingress clients use.

It opens once the client port listens (a probe that passes here means the gateway answers clients
too) and closes when the client server stops. It installs no signal handlers: the client server owns
SIGINT/SIGTERM, and its end ends this one.

A worker of `--workers N` serves it on a private loopback socket its supervisor bound instead: the
supervisor alone listens on `metrics_port`, and merges what its workers serve (`supervisor/`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import ASGIApp

from llamafleet_router.settings import RouterSettings
from llamafleet_router.transport import uvicorn_options


class QuietServer(uvicorn.Server):
    """A uvicorn server that installs no signal handlers: another server, or a supervisor, owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _when_started(main: uvicorn.Server, server: uvicorn.Server, sock: socket.socket | None) -> None:
    while not main.started:  # uvicorn has no start event to await
        if main.should_exit or server.should_exit:
            return
        await asyncio.sleep(0.05)
    await server.serve(sockets=None if sock is None else [sock])


@contextlib.asynccontextmanager
async def metrics_port(
    main: uvicorn.Server, app: ASGIApp, settings: RouterSettings, sock: socket.socket | None = None,
) -> AsyncIterator[None]:
    """Serve `app` on `settings.metrics_port`, or on `sock` when given, while `main` runs inside this
    context (nothing when neither is set)."""
    if sock is None and settings.metrics_port is None:
        yield
        return
    config = uvicorn.Config(app, host=settings.host, port=settings.metrics_port or 0, log_config=None,
                            lifespan="off", proxy_headers=False, access_log=False,
                            timeout_graceful_shutdown=1, **uvicorn_options(settings))
    server = QuietServer(config)
    task = asyncio.create_task(_when_started(main, server, sock), name="metrics-port")
    try:
        yield
    finally:
        server.should_exit = True
        await task

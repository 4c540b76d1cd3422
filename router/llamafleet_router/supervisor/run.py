"""`supervise(settings)`: the `llamafleet router` process when `workers` > 1.

Both ports are bound here before any worker starts, so that a port in use fails the pod at once with
one clear line (and port 0 becomes a real port the workers then share). The metrics port opens once
every worker has answered once, as a single gateway's opens once its client port listens: the
readiness probe then means that the pod serves clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from llamafleet_core import http_pool
from llamafleet_router.metrics_port import QuietServer
from llamafleet_router.settings import RouterSettings
from llamafleet_router.supervisor.front import front_app
from llamafleet_router.supervisor.metrics import SupervisorMetrics
from llamafleet_router.supervisor.processes import Supervisor
from llamafleet_router.supervisor.sockets import bound_socket, port_of, shared_port_socket
from llamafleet_router.transport import uvicorn_options

log = logging.getLogger(__name__)


def supervise(settings: RouterSettings) -> int:
    """Run `settings.workers` gateway workers until SIGTERM or SIGINT; the exit code."""
    return asyncio.run(_supervise(settings))


def _bind(settings: RouterSettings) -> tuple[socket.socket, socket.socket | None] | None:
    """The client port's reservation and the metrics port's socket; None (logged) when one is taken."""
    try:
        client = shared_port_socket(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot bind the gateway's port", extra={"host": settings.host, "port": settings.port,
                                                           "error": str(exc)})
        return None
    if settings.metrics_port is None:
        return client, None
    try:
        return client, bound_socket(settings.host, settings.metrics_port)
    except OSError as exc:
        client.close()
        log.error("cannot bind the metrics port", extra={"host": settings.host,
                                                         "metrics_port": settings.metrics_port,
                                                         "error": str(exc)})
        return None


async def _supervise(settings: RouterSettings) -> int:
    bound = _bind(settings)
    if bound is None:
        return 1
    reservation, front_socket = bound
    with reservation, front_socket or contextlib.nullcontext():
        port = port_of(reservation)
        metrics = SupervisorMetrics(CollectorRegistry(), settings.workers)
        async with http_pool.async_client() as http:
            supervisor = Supervisor(settings.model_copy(update={"port": port}), metrics, http)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, supervisor.stop)
            log.info("starting the gateway's workers", extra={"workers": settings.workers, "port": port})
            front = None
            if front_socket is not None:
                front = asyncio.create_task(_serve_front(supervisor, metrics, http, front_socket, settings),
                                            name="metrics-port")
            try:
                return await supervisor.run()
            finally:
                supervisor.stop()
                if front is not None:
                    await front
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)


async def _serve_front(
    supervisor: Supervisor, metrics: SupervisorMetrics, http: httpx.AsyncClient, sock: socket.socket,
    settings: RouterSettings,
) -> None:
    """The merged /metrics and /health on `sock`, from when every worker answered until the stop."""
    ready = asyncio.create_task(supervisor.all_answered.wait())
    stopping = asyncio.create_task(supervisor.stopping.wait())
    await asyncio.wait({ready, stopping}, return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    if supervisor.stopping.is_set():
        return
    config = uvicorn.Config(front_app(supervisor.addresses, metrics, http), log_config=None, lifespan="off",
                            proxy_headers=False, access_log=False, timeout_graceful_shutdown=1,
                            **uvicorn_options(settings))
    server = QuietServer(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="metrics-port-server")
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    stopping.cancel()

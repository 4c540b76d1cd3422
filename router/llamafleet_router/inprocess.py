"""Run a router app in-process: for tests and for embedding (local runtime, benchmarks).

- `app_client(app)`: the lifespan runs, requests go through `httpx.ASGITransport` (no socket). Responses
  are buffered by the transport, so it does not show streaming timing or client disconnects.
- `serve(app)`: a real uvicorn server on a free loopback port, for true streaming and disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette

from llamafleet_core import http_pool


@contextlib.asynccontextmanager
async def app_client(app: Starlette, base_url: str = "http://router") -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with http_pool.async_client(transport=transport, base_url=base_url, timeout=30.0) as client:
            yield client


@contextlib.asynccontextmanager
async def serve(
    app: Starlette, host: str = "127.0.0.1", startup_timeout: float = 10.0, shutdown_timeout: float = 30.0,
    *, sock: socket.socket | None = None, server_cls: type[uvicorn.Server] = uvicorn.Server,
    graceful_shutdown: int | None = None, http: type[asyncio.Protocol] | str = "auto",
) -> AsyncIterator[str]:
    """Serve `app` with uvicorn and yield its base URL: on `sock` when the caller bound one already
    (the local runtime binds first, so a taken port fails before any pod starts), else on a free port
    of `host`. `server_cls` lets an embedder keep uvicorn off its signal handlers; `graceful_shutdown`
    bounds how long open connections may delay the stop; `http` is uvicorn's protocol (a gateway's:
    `transport.bounded_protocol`, which bounds request heads)."""
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, lifespan="on", log_config=None, access_log=False,
                            timeout_graceful_shutdown=graceful_shutdown, http=http)
    server = server_cls(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="gateway")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + startup_timeout
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited during startup")
            if loop.time() > deadline:
                raise TimeoutError("uvicorn did not start in time")
            await asyncio.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        # Shutdown drains the after-response tasks (bounded by the app's own drain limit, 10 s), so
        # give it longer than that before forcing the exit.
        try:
            async with asyncio.timeout(shutdown_timeout):
                await asyncio.shield(task)
        except TimeoutError:
            server.force_exit = True
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(5.0):
                    await task
        except asyncio.CancelledError:
            pass
        sock.close()

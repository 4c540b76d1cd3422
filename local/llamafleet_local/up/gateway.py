"""The gateway of a local fleet: the router app, in-process, on 127.0.0.1:PORT.

In-process rather than a `llamafleet router` subprocess for two reasons: `/health` can then ask the
runtime directly whether every pod is up and every SharedPrefix warm (`create_app(readiness=...)`), and
with `--index memory` the warming library and the gateway share the one in-memory index, which no
second process could see. The router's JSON logs go to `gateway.log` in the run folder, not the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from pydantic import SecretStr
from starlette.applications import Starlette

from llamafleet_core.index.base import PrefixIndex, SlotLeases
from llamafleet_router import inprocess
from llamafleet_router.api.info import Readiness
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.logs import JsonFormatter
from llamafleet_router.settings import RouterSettings
from llamafleet_router.transport import HeadBounds, bounded_protocol

_LOGGERS = ("llamafleet_router", "uvicorn", "uvicorn.error", "uvicorn.access")
CONNECTIONS_GRACE_S = 1  # uvicorn takes whole seconds
SHUTDOWN_S = 2.0  # then uvicorn is forced out (within `shutdown.GATEWAY_S`, which bounds the whole step)


@dataclass
class Index:
    """The prefix index and slot leases the gateway and the warming library share."""

    index: PrefixIndex
    leases: SlotLeases
    redis_url: str | None  # None: in memory


def open_index(redis_url: str | None) -> Index:
    if redis_url is None:
        from llamafleet_core.index.memory import InMemoryPrefixIndex
        from llamafleet_core.index.memory_leases import InMemorySlotLeases

        return Index(InMemoryPrefixIndex(), InMemorySlotLeases(), None)
    from llamafleet_core.index.redis_conn import connect_index
    from llamafleet_core.index.redis_index import RedisPrefixIndex
    from llamafleet_core.index.redis_leases import RedisSlotLeases

    # One client for both: its fail-fast timeouts are what the router relies on in degraded mode.
    client = connect_index(redis_url)
    return Index(RedisPrefixIndex(client), RedisSlotLeases(client), redis_url)


async def close_index(index: Index | None) -> None:
    if index is not None:
        await index.index.close()


def log_to_file(path: Path) -> logging.Handler:
    """Send the router's and uvicorn's loggers to `path`; returns the handler to remove afterwards."""
    handler = logging.FileHandler(path)
    handler.setFormatter(JsonFormatter())
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return handler


def detach_log(handler: logging.Handler) -> None:
    """Undo `log_to_file` (an embedding process outlives the run folder's log)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if handler in logger.handlers:
            logger.removeHandler(handler)
            logger.propagate = True
    handler.close()


def build_app(pods: Sequence[tuple[str, str]], index: Index, readiness: Readiness, *, model_name: str,
              agent_token: str, poll_interval: float = 0.5, attach: bool = False, cache_prefix: bool = False,
              min_batch_tokens: int | None = None, pod_api_key: str | None = None,
              prefix_key: str = "") -> Starlette:
    """The router app over `(llama_url, agent_url)` pods, exactly as `llamafleet router` builds it,
    with the agents' token, so restore-on-miss and first-sight snapshots are on. `attach`: the pods run
    llama-server with --slot-attach, `cache_prefix`: with --cache-prefix (static pods say so with a third
    field). `min_batch_tokens`: the
    prefill cost model's small-batch cliff for the pods' build (None: the pipeline's default).
    `prefix_key`: the index's hash key, which warming uses too (`state.prefix_key`). A local fleet has
    one user, on 127.0.0.1 and without API keys: the routing headers are on for it."""
    flags = "+".join(name for name, on in (("attach", attach), ("cache-prefix", cache_prefix)) if on)
    flag = f"|{flags}" if flags else ""
    settings = RouterSettings(
        pods=[f"{url}|{agent}{flag}" for url, agent in pods], redis_url=index.redis_url,
        index="redis" if index.redis_url else "memory", poll_interval=poll_interval, model_name=model_name,
        agent_token=SecretStr(agent_token), min_batch_tokens=min_batch_tokens,
        pod_api_key=SecretStr(pod_api_key) if pod_api_key else None,
        prefix_key=SecretStr(prefix_key) if prefix_key else None, expose_routing_headers=True,
    )

    def discovery(http: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        # startup_timeout 0: pods start after the gateway (so /health says 503 meanwhile); no waiting.
        return StaticDiscovery(settings.pod_specs, http, poll_interval=poll_interval,
                               model_name=model_name, fence=fence, startup_timeout=0.1,
                               api_key=pod_api_key)

    return create_app(settings, index=index.index, leases=index.leases, discovery=discovery,
                      readiness=readiness)


def bind(host: str, port: int) -> socket.socket:
    """Bind now (port 0: any free one), so a taken port fails before any pod is started."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its SIGINT/SIGTERM handlers: `up` owns the signals and stops the gateway first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(
    app: Starlette, sock: socket.socket, startup_timeout: float = 15.0
) -> contextlib.AbstractAsyncContextManager[str]:
    """Serve `app` with uvicorn on the bound socket (the gateway's own serve loop, without uvicorn's
    signal handlers); yields the base URL, stops it on exit.

    The stop is short on purpose (`up` must be gone within 10 s of a SIGTERM, `shutdown.py`): open
    connections get `CONNECTIONS_GRACE_S`, and the whole shutdown `SHUTDOWN_S`, after which uvicorn is
    forced out. The app's lifespan shutdown alone may otherwise take 10 s and more: it drains the
    gateway's background tasks (restores, copies, primes), which after a pod restart may be waiting on
    that pod. What it leaves running is cancelled when `up`'s event loop closes (`cli.run_bounded`).
    Request heads are bounded as by `llamafleet router` (the router settings' header size and time)."""
    return inprocess.serve(app, startup_timeout=startup_timeout, sock=sock, server_cls=_QuietServer,
                           graceful_shutdown=CONNECTIONS_GRACE_S, shutdown_timeout=SHUTDOWN_S,
                           http=bounded_protocol(HeadBounds.from_settings(RouterSettings())))

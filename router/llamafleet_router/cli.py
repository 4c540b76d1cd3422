"""`llamafleet router ...`: build settings from flags (over `LLAMAFLEET_ROUTER_*`), the index, and run.

    llamafleet router --pods http://10.0.0.5:8080,http://10.0.0.6:8080|http://10.0.0.6:8090 \
        --redis redis://redis:6379/0 --config pipeline.yaml --api-keys-file keys.txt --port 8000

With `--workers N` (N > 1) this process supervises N worker processes instead (`supervisor/`), each
of which runs the gateway below (`run`) on the same port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from pydantic import ValidationError

from llamafleet_core.index.base import PrefixIndex, SlotLeases
from llamafleet_core.settings_support import describe
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.logs import configure_logging
from llamafleet_router.metrics_port import metrics_port
from llamafleet_router.settings import RouterSettings
from llamafleet_router.transport import uvicorn_options

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llamafleet router", description="Prefix-aware OpenAI-compatible gateway."
    )
    p.add_argument("--pods", help="comma-separated llama-server URLs, each optionally `url|agent_url`")
    p.add_argument("--discovery", choices=["static", "redis"],
                   help="`redis`: the pods are the fleet membership the operator writes to --redis")
    p.add_argument("--fleets", help="with --discovery redis: comma-separated `namespace/name` (default: all)")
    index = p.add_mutually_exclusive_group()
    index.add_argument("--redis", dest="redis_url", help="Redis URL of the shared prefix index")
    index.add_argument("--index", choices=["memory", "redis"], help="`memory` for a single replica")
    p.add_argument("--config", dest="config_file", type=Path, help="scheduling pipeline YAML")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int,
                   help="gateway processes sharing the port (default 1; more than 1 needs the Redis index)")
    p.add_argument("--api-keys-file", type=Path, help="file of `name:key` lines")
    p.add_argument("--agent-token-file", type=Path,
                   help="the pods' snapshot agents' shared token (turns snapshot restore and first sight on)")
    p.add_argument("--model-name", help="model name clients use (default: from each pod's /props)")
    p.add_argument("--log-level")
    return p


def settings_from_args(argv: list[str] | None) -> RouterSettings:
    args = parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return RouterSettings(**overrides)


def build_index(settings: RouterSettings) -> tuple[PrefixIndex, SlotLeases, Any]:
    """The index and leases, plus the Redis client to close afterwards (None for memory)."""
    if settings.index == "redis":
        from llamafleet_core.index.redis_conn import connect_index
        from llamafleet_core.index.redis_index import RedisPrefixIndex
        from llamafleet_core.index.redis_leases import RedisSlotLeases

        assert settings.redis_url is not None
        # Short timeouts, no retries: a Redis outage must switch the router to degraded routing within
        # a request, not stall requests.
        client = connect_index(settings.redis_url)
        prefix = settings.index_prefix
        return RedisPrefixIndex(client, prefix=prefix), RedisSlotLeases(client, prefix=prefix), client
    from llamafleet_core.index.memory import InMemoryPrefixIndex
    from llamafleet_core.index.memory_leases import InMemorySlotLeases

    return InMemoryPrefixIndex(), InMemorySlotLeases(), None


async def run(
    settings: RouterSettings, *, client_socket: socket.socket | None = None,
    metrics_socket: socket.socket | None = None,
) -> None:
    """The gateway, on `settings.host:port` (and `metrics_port`), or on the sockets given: a worker's
    (the shared client port, its private metrics port)."""
    index, leases, redis_client = build_index(settings)
    specs = settings.pod_specs
    pod_key = settings.resolved_pod_api_key()  # llama-server's own key, if the pods run with one
    owned: list[Any] = []  # redis-py clients made for discovery, closed at the end

    def discovery(http: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        if settings.discovery == "redis":
            from llamafleet_core.index.redis_conn import connect
            from llamafleet_router.discovery.membership import MembershipDiscovery

            assert settings.redis_url is not None
            client = connect(settings.redis_url)  # redis-py: membership is off the request path
            owned.append(client)
            return MembershipDiscovery(client, settings.fleets, http, poll_interval=settings.poll_interval,
                                       model_name=settings.model_name, fence=fence,
                                       hang_timeout=settings.hang_timeout, prefix=settings.index_prefix,
                                       member_networks=settings.member_networks, api_key=pod_key,
                                       membership_key=settings.resolved_membership_key())
        return StaticDiscovery(specs, http, poll_interval=settings.poll_interval,
                               model_name=settings.model_name, fence=fence,
                               hang_timeout=settings.hang_timeout, api_key=pod_key)

    app = create_app(settings, index=index, leases=leases, discovery=discovery)
    # access_log off: the gateway logs its own line per request, with the routing decision in it.
    # The transport options bound a request's head before the app runs (size, time: transport.py).
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, lifespan="on",
                            proxy_headers=False, timeout_graceful_shutdown=30, access_log=False,
                            **uvicorn_options(settings))
    server = uvicorn.Server(config)
    freezer = asyncio.create_task(freeze_heap_when_started(server), name="gc-freeze")
    try:
        # /metrics and the detailed /health without a key, on their own port (metrics_port.py).
        async with metrics_port(server, app.state.metrics_app, settings, metrics_socket):
            await server.serve(sockets=None if client_socket is None else [client_socket])
    finally:
        freezer.cancel()
        await index.close()
        for client in [redis_client, *owned]:
            if client is not None:
                await client.aclose()


async def freeze_heap_when_started(server: uvicorn.Server, limit_s: float = 120.0) -> None:
    """Once the server listens, move everything alive (modules, the app, its clients and caches) out of
    the garbage collector's sight with `gc.freeze()`.

    A full (generation 2) collection walks every tracked object, and on a started gateway its pauses
    of the event loop were the gateway's whole p99 under load (docs/design.md, "Measurements behind the
    rules"). Frozen objects are never collected, which is right for what
    lives as long as the process; what requests allocate later is collected as usual. The gen-0
    threshold is raised so that fewer short-lived request objects are promoted to older generations
    (each promotion makes the next full collection longer)."""
    deadline = time.monotonic() + limit_s
    while not server.started:
        if server.should_exit or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)
    log.info("heap frozen after start", extra={"frozen_objects": freeze_heap()})


def freeze_heap() -> int:
    """The gateway's collector policy, applied now (`freeze_heap_when_started` says why; the fleet
    simulator applies it to its own process as a started gateway has it): everything alive frozen, the
    gen-0 threshold raised. The number of objects frozen."""
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(10_000, gen1, gen2)
    return gc.get_freeze_count()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv)
    except ValidationError as exc:
        print(f"llamafleet router: invalid settings:\n{describe(exc)}")
        return 2
    configure_logging(settings.log_level)
    if settings.discovery == "static" and not settings.pods:
        log.warning("no pods configured (--pods or LLAMAFLEET_ROUTER_PODS): every request will get 503")
    if settings.workers > 1:
        from llamafleet_router.supervisor.run import supervise

        return supervise(settings)
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run(settings))
    return 0


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (`uvicorn[standard]`): it cut the gateway's CPU per
    request noticeably (bench/README.md); the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop

"""`create_app(settings, ...)`: the gateway as a Starlette app, its collaborators passed in.

Nothing is module-level: the HTTP client is created in the lifespan (unless injected), the registry is the
caller's (or a fresh one), discovery and the scheduler come in or are built from the app's client. The
lifespan starts discovery and the index watcher, and on shutdown waits for after-response tasks so no
index write is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from llamafleet_core import http_pool
from llamafleet_core.index.base import PrefixIndex, SlotLeases
from llamafleet_core.types import PodRef
from llamafleet_router.access.auth import ApiKeys
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.api.asgi import GatewayApp, RequestIdMiddleware
from llamafleet_router.api.fields import FieldPolicy
from llamafleet_router.api.gateway import Gateway
from llamafleet_router.api.info import InfoRoutes, Readiness, http_error, server_error
from llamafleet_router.api.limited import limiter_from_settings
from llamafleet_router.api.models import ModelRoutes
from llamafleet_router.api.openapi import openapi_endpoint
from llamafleet_router.api.prompts import PromptRenderer
from llamafleet_router.background import IndexHealth
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.fleet.leases import ReplicaLeases
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.upstream import GatewayClient
from llamafleet_router.request.after import SchedulerLike
from llamafleet_router.request.assembly import Fixed, assemble
from llamafleet_router.request.director import Upstream
from llamafleet_router.settings import RouterSettings
from llamafleet_router.snapshots import SnapshotConfig
from llamafleet_router.snapshots.resync import keep_synced

log = logging.getLogger(__name__)

#: Builds discovery from the app's HTTP client and the fencing hook (purges a restarted pod's entries).
DiscoveryFactory = Callable[[httpx.AsyncClient, FenceHook], Discovery]

_SHUTDOWN_DRAIN_S = 10.0


def make_http_client(settings: RouterSettings) -> httpx.AsyncClient:
    """The app's one HTTP client (with the proxy's aiohttp session, see upstream.py). `read=None`:
    generations may stream for many minutes."""
    return GatewayClient(
        connect_timeout=settings.connect_timeout,
        max_connections=settings.max_connections,
        timeout=httpx.Timeout(connect=settings.connect_timeout, read=None, write=settings.write_timeout,
                              pool=settings.pool_timeout),
        # Pooled connections expire before the pods and agents close them, and an idempotent read
        # a pod dropped unanswered is sent once more (http_pool.py).
        transport=http_pool.async_transport(
            limits=http_pool.pool_limits(settings.max_connections, min(settings.max_connections, 256))),
    )


def build_scheduler(
    settings: RouterSettings, index: PrefixIndex, leases: ReplicaLeases, metrics: RouterMetrics
) -> SchedulerLike:
    from llamafleet_router.scheduling.config import default_config, load_config_file
    from llamafleet_router.scheduling.scheduler import Scheduler

    config = load_config_file(settings.config_file) if settings.config_file else default_config()
    if settings.min_batch_tokens is not None:
        decision = config.decision.model_copy(update={"min_batch_tokens": settings.min_batch_tokens})
        config = config.model_copy(update={"decision": decision})
    return Scheduler(
        config, index=index, leases=leases, holder_prefix=leases.replica,
        metrics_hook=metrics.scheduler_hook,
    )


def replica_name() -> str:
    """This router replica's name in slot leases: unique per process, readable in Redis."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _fence(index: PrefixIndex, metrics: RouterMetrics, health: IndexHealth) -> FenceHook:
    async def fence(old: PodRef) -> None:
        try:
            purged = await index.purge_pod(old.uid)
            log.info("purged the index entries of a pod (down, restarted or gone)",
                     extra={"uid": old.uid, "entries": purged})
        except Exception as exc:
            # They expire by TTL, and the next fence (the pod seen again) tries once more.
            metrics.index_errors.labels("purge_pod").inc()
            health.mark_degraded(f"purge_pod: {exc}")
    return fence


def create_app(
    settings: RouterSettings,
    *,
    index: PrefixIndex,
    leases: SlotLeases,
    discovery: Discovery | DiscoveryFactory,
    scheduler: SchedulerLike | None = None,
    registry: CollectorRegistry | None = None,
    http: httpx.AsyncClient | None = None,
    readiness: Readiness | None = None,
) -> GatewayApp:
    """The gateway app. `discovery` is a Discovery, or a factory called in the lifespan with the app's
    HTTP client and the fencing hook. An injected `http` client is used and left open (its owner closes
    it); otherwise the lifespan creates and closes one. `readiness`, when given, is one more condition
    for `/health` (the local runtime's "all pods up, all prefixes warm"). `app.state.gateway` exposes the
    running state to embedding code and tests; routes never look anything up there."""
    metrics = RouterMetrics(registry if registry is not None else CollectorRegistry())
    keys = ApiKeys.from_settings(settings)
    if not keys.enabled:
        log.warning("no API key configured: authentication is OFF")
    health = IndexHealth(index, metrics, settings.index_ping_interval)
    tenancy = Tenancy.build(
        auth_enabled=keys.enabled, admin_keys=settings.admin_keys, key_tenants=settings.key_tenants,
        expose_routing_headers=settings.expose_routing_headers, known_keys=(n for _, n in keys.entries),
    )
    gateway = Gateway(
        keys=keys, metrics=metrics, health=health,
        prompts=PromptRenderer(settings.block_chars, settings.resolved_prefix_key()),
        max_body_bytes=settings.max_body_bytes, retries=settings.retries,
        body_timeout_s=settings.body_timeout_s, max_response_bytes=settings.max_response_bytes,
        limiter=limiter_from_settings(settings),
        owners=ModelOwners.from_entries(settings.model_fleets), tenancy=tenancy,
        fields=FieldPolicy.from_settings(settings),
    )
    pod_key = settings.resolved_pod_api_key()
    gateway.pod_headers = {"authorization": f"Bearer {pod_key}"} if pod_key else {}
    # Restore-on-miss and first-sight snapshots need the pods' agents: on when an agent token is set.
    gateway.enable_snapshots(SnapshotConfig.from_settings(settings))
    info = InfoRoutes(gateway, readiness)
    models = ModelRoutes(gateway)
    unlocked = InfoRoutes(gateway, readiness, unlocked=True)  # the metrics port's

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = http if http is not None else make_http_client(settings)
        if isinstance(discovery, Discovery):
            disc = discovery
        else:
            disc = discovery(client, _fence(index, metrics, health))
        show_ignored = getattr(disc, "show_ignored_on", None)  # membership discovery: ignored members
        if show_ignored is not None:
            show_ignored(metrics.members_ignored)
        bind = getattr(disc, "bind_agent_tokens", None)  # membership discovery: agents by namespace
        snapshot_config = gateway.snapshot_config
        if bind is not None and snapshot_config is not None and snapshot_config.tokens is not None:
            bind(snapshot_config.tokens)
        replica_leases: ReplicaLeases | None = None
        if scheduler is None:
            replica_leases = ReplicaLeases(leases, replica_name())
            sched = build_scheduler(settings, index, replica_leases, metrics)
        else:
            sched = scheduler
        config, snapshot_metrics = gateway.snapshot_config, gateway.snapshot_metrics
        fixed = Fixed(
            in_flight=gateway.in_flight, tasks=gateway.tasks, owners=gateway.owners, tenancy=gateway.tenancy,
            metrics=metrics, health=health, retries=settings.retries, block_chars=settings.block_chars,
            chars_per_token=settings.chars_per_token,
            snapshots=None if config is None or snapshot_metrics is None else (config, snapshot_metrics))
        gateway.start(assemble(
            fixed, upstream=Upstream(client, gateway.pod_headers, settings.max_response_bytes),
            discovery=disc, scheduler=sched, index=index, leases=replica_leases))
        await health.check()
        watcher = asyncio.create_task(health.run(), name="index-health")
        await disc.start()
        resyncer = None
        if gateway.snapshot_config is not None:
            resyncer = asyncio.create_task(keep_synced(
                lambda: gateway.snapshots.resync if gateway.snapshots is not None else None,
                disc.endpoints, gateway.snapshot_config.resync_interval_s), name="snapshot-resync")
        try:
            yield
        finally:
            # Not background.cancel_and_wait: it lets a cancel of the lifespan itself through, and the
            # shutdown below (discovery, draining, the HTTP client) must run in any case.
            for task in (watcher, resyncer):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await disc.stop()
            await gateway.tasks.drain(_SHUTDOWN_DRAIN_S)
            if http is None:
                await client.aclose()

    app = GatewayApp(
        handler=gateway.infer,
        routes=[
            Route("/v1/models", models.list, methods=["GET"]),
            Route("/v1/models/{model_id:path}", models.one, methods=["GET"]),
            Route("/health", info.health, methods=["GET"]),
            Route("/metrics", info.metrics, methods=["GET"]),
            Route("/openapi.json", openapi_endpoint, methods=["GET"]),
        ],
        middleware=[Middleware(RequestIdMiddleware)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    # Served on `metrics_port` by `llamafleet router` (cli.py): details without a key, off the client port.
    app.state.metrics_app = Starlette(routes=[
        Route("/health", unlocked.health, methods=["GET"]),
        Route("/metrics", unlocked.metrics, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error, Exception: server_error})
    return app


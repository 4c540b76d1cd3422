"""A gateway served in the test's own event loop (real uvicorn, real proxy path) over fake pods served the
same way, for the isolation tests: the tests read the gateway's state (its leases, its index) directly.

Fleets in Redis: `write_fleet` puts a fake pod into a fleet's membership exactly as the operator does
(`llamafleet_core.membership`); the agent port is the pod's own, whose catch-all answers the agent's
`/ready` with 200, so discovery routes to it as to a pod with a ready agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis.asyncio as aioredis
from starlette.applications import Starlette

from llamafleet_core.index.base import PrefixIndex, SlotLeases
from llamafleet_core.membership import Member, write_members
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.membership import MembershipDiscovery
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.logs import JsonFormatter
from llamafleet_router.settings import RouterSettings
from tests.fuzz.fake_pod import Stream, fake_pod


@dataclass
class Pod:
    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)


@contextlib.asynccontextmanager
async def pod() -> AsyncIterator[Pod]:
    received: list[dict[str, Any]] = []
    streams: list[Stream] = []
    async with serve(fake_pod(received, None, streams)) as url:
        yield Pod(url, received, streams)


async def write_fleet(redis: aioredis.Redis, fleet: str, pods: list[Pod], prefix: str) -> None:
    namespace, name = fleet.split("/")
    members = []
    for i, p in enumerate(pods):
        port = int(urlsplit(p.url).port or 0)
        members.append(Member(name=f"{name}-{i}", uid=f"{fleet}-{i}", ip="127.0.0.1", port=port,
                              agent_port=port, slots=2, model="fake", ready=True, epoch=1))
    await write_members(redis, namespace, name, members, prefix=prefix)


@dataclass
class Gateway:
    url: str
    app: Starlette

    @property
    def state(self) -> Any:
        return self.app.state.gateway


@contextlib.asynccontextmanager
async def gateway(settings: RouterSettings, *, index: PrefixIndex, leases: SlotLeases,
                  redis: aioredis.Redis | None = None) -> AsyncIterator[Gateway]:
    """The gateway as `llamafleet router` builds it: membership discovery over `redis` when the settings
    say `discovery=redis` (with their fleets, prefix and member networks), else static pods."""
    def discovery(http: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        if settings.discovery == "redis":
            assert redis is not None
            return MembershipDiscovery(redis, settings.fleets, http, poll_interval=settings.poll_interval,
                                       fence=fence, prefix=settings.index_prefix,
                                       member_networks=settings.member_networks)
        return StaticDiscovery(settings.pod_specs, http, poll_interval=settings.poll_interval, fence=fence)

    app = create_app(settings, index=index, leases=leases, discovery=discovery)
    async with serve(app) as url:
        yield Gateway(url, app)


class LogLines(list[str]):
    """The router's log lines as its JSON formatter wrote them (with the request ids of the context)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def finished(self) -> list[dict[str, Any]]:
        """The "request finished" lines, parsed."""
        return [json.loads(line) for line in self if '"request finished"' in line]

    async def until_finished(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until `count` requests have logged their end (each line wakes the wait)."""
        async with asyncio.timeout(timeout):
            while len(done := self.finished()) < count:
                self.changed.clear()
                await self.changed.wait()
        return done


@contextlib.contextmanager
def json_log_lines() -> Iterator[LogLines]:
    lines = LogLines()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))
            lines.changed.set()  # the gateway logs on the test's own event loop

    handler = Collect()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("llamafleet_router")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)

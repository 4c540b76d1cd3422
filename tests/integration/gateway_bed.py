"""A real gateway over real llama-server pods and a real Redis, for the integration tests.

`gateway(...)` builds the app exactly as `llamafleet router` does (create_app + StaticDiscovery +
the Redis index with its fail-fast client) and serves it with uvicorn on a loopback port.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette

from llamafleet_core.index.redis_index import RedisPrefixIndex, RedisSlotLeases, connect
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.settings import RouterSettings


@dataclass
class Gateway:
    url: str
    app: Starlette
    index: RedisPrefixIndex
    leases: RedisSlotLeases


@contextlib.asynccontextmanager
async def gateway(
    pod_urls: Sequence[str], redis_url: str, *, prefix: str = "lf", http: httpx.AsyncClient | None = None,
    poll_interval: float = 0.5,
) -> AsyncIterator[Gateway]:
    settings = RouterSettings(pods=",".join(pod_urls), redis_url=redis_url, poll_interval=poll_interval,
                              index_ping_interval=0.2)
    client = connect(redis_url)
    index = RedisPrefixIndex(client, prefix=prefix)
    leases = RedisSlotLeases(client, prefix=prefix)

    def discovery(http_client: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        return StaticDiscovery(settings.pod_specs, http_client, poll_interval=poll_interval, fence=fence)

    app = create_app(settings, index=index, leases=leases, discovery=discovery, http=http)
    try:
        async with serve(app) as url:
            yield Gateway(url, app, index, leases)
    finally:
        await client.aclose()


@dataclass
class Answer:
    status: int
    pod: str
    slot: int
    action: str
    cache_n: int
    prompt_n: int
    raw: bytes

    @property
    def prompt_tokens(self) -> int:
        return self.cache_n + self.prompt_n


def _timings(raw: bytes, stream: bool) -> dict[str, Any]:
    if not stream:
        timings: dict[str, Any] = json.loads(raw).get("timings", {})
        return timings
    found: dict[str, Any] = {}
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            found = json.loads(line[6:]).get("timings", found)
    return found


async def chat(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Answer:
    """One chat request through the gateway, read to the end."""
    stream = bool(body.get("stream"))
    resp = await http.post(url + "/v1/chat/completions", json=body)
    timings = _timings(resp.content, stream) if resp.status_code == 200 else {}
    return Answer(
        status=resp.status_code,
        pod=resp.headers.get("x-llamafleet-pod", ""),
        slot=int(resp.headers.get("x-llamafleet-slot", "-1")),
        action=resp.headers.get("x-llamafleet-action", ""),
        cache_n=int(timings.get("cache_n", 0)),
        prompt_n=int(timings.get("prompt_n", 0)),
        raw=resp.content,
    )

"""A real gateway over real llama-server pods and a real Redis, for the integration tests.

`gateway(...)` builds the app exactly as `llamafleet router` does (create_app + StaticDiscovery +
the Redis index with its fail-fast client) and serves it with uvicorn on a loopback port. Pods may be
given as `url|agent_url`; with `agent_token` the gateway's snapshot flow is on; with `prefix_key` its
hashes (blocks, snapshot names, head families) are keyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import SecretStr
from starlette.applications import Starlette

from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.scheduling.config import DEFAULT_CONFIG
from llamafleet_router.settings import RouterSettings
from llamafleet_router.snapshots import SnapshotConfig


@dataclass
class Gateway:
    url: str
    app: Starlette
    index: RedisPrefixIndex
    leases: RedisSlotLeases


@contextlib.asynccontextmanager
async def gateway(
    pod_urls: Sequence[str], redis_url: str, *, prefix: str = "lf", http: httpx.AsyncClient | None = None,
    poll_interval: float = 0.5, agent_token: str | None = None, prefix_key: str | None = None,
) -> AsyncIterator[Gateway]:
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bed-"))
    settings = RouterSettings(pods=list(pod_urls), redis_url=redis_url, poll_interval=poll_interval,
                              index_ping_interval=0.2, config_file=_patient_lookup(workdir),
                              agent_token=SecretStr(agent_token) if agent_token else None,
                              prefix_key=SecretStr(prefix_key) if prefix_key else None,
                              expose_routing_headers=True)  # the tests read x-llamafleet-* (no keys here)
    client = connect_index(redis_url)
    index = RedisPrefixIndex(client, prefix=prefix)
    leases = RedisSlotLeases(client, prefix=prefix)

    def discovery(http_client: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        return StaticDiscovery(settings.pod_specs, http_client, poll_interval=poll_interval, fence=fence)

    app = create_app(settings, index=index, leases=leases, discovery=discovery, http=http)
    # Idempotent: a no-op once create_app turns snapshots on from the settings itself.
    app.state.gateway.enable_snapshots(SnapshotConfig.from_settings(settings))
    try:
        async with serve(app) as url:
            await _until_healthy(url)
            yield Gateway(url, app, index, leases)
    finally:
        await client.aclose()
        shutil.rmtree(workdir, ignore_errors=True)


def _patient_lookup(workdir: Path) -> Path:
    """The default pipeline with a 2 s index lookup deadline instead of 0.25 s.

    Here the gateway, the agents and the test share one event loop, and two llama-servers prefilling
    ~12K tokens hold both cores: a lookup that Redis answers at once can still miss a 0.25 s wall-clock
    deadline, and the request then routes degraded (seen once in CI). These tests check what the index
    makes of the fleet; the fallback has tests of its own (test_degraded.py, the reliability suite)."""
    config = copy.deepcopy(DEFAULT_CONFIG)
    for plugin in config["plugins"]:
        if plugin["type"] == "prefix-lookup":
            plugin["params"] = {"timeout_s": 2.0}
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def _until_healthy(url: str, timeout: float = 60.0) -> None:
    """Every pod routable: a pod with an agent is routable once its agent is ready (the model's digest
    computed, required snapshots held), which takes a moment after llama-server answers."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(timeout=5.0) as http:
        while asyncio.get_running_loop().time() < deadline:
            body = (await http.get(url + "/health")).json()
            if body.get("pods_down", 1) == 0 and body.get("pods_up", 0) > 0:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway at {url} did not see every pod ready within {timeout}s")


async def settled(gw: Gateway, timeout: float = 60.0) -> None:
    """Until the gateway has no request in flight, no slot held and no work off the request path left
    (the index writes after a response, primes, detached builds, ships): what a test reads or changes
    next is no longer moving. The finisher ends a request's count and spawns its after-response work
    in one synchronous step, so no state between the two passes for settled."""
    state = gw.app.state.gateway
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = {"in_flight": state.in_flight.total(), "tasks": len(state.tasks),
                "slots_held": state.leases.held() if state.leases is not None else 0}
        if not any(left.values()):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the gateway was still busy {timeout}s on: {left}")
        await asyncio.sleep(0.02)


@dataclass
class Answer:
    status: int
    pod: str
    slot: int
    action: str
    cache_n: int
    prompt_n: int
    raw: bytes
    snapshot: str = ""  # x-llamafleet-snapshot: the snapshot restored before forwarding, if any
    prompt_ms: float = 0.0  # the server's time to compute `prompt_n`

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
        snapshot=resp.headers.get("x-llamafleet-snapshot", ""),
        prompt_ms=float(timings.get("prompt_ms", 0.0)),
    )

"""The orchestration bed: fake pods and agents on loopback ports, and the real gateway over them.

The gateway is built as `llamafleet router` builds it (create_app, static discovery, the Redis index)
with its own production HTTP client: the proxied leg goes through aiohttp to the fakes' sockets, and
discovery, first sight and the agent calls through httpx. It is served with uvicorn on loopback.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.types import SlotRef
from llamafleet_router.app import create_app
from llamafleet_router.discovery.base import Discovery, FenceHook
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.settings import RouterSettings
from tests.integration.gateway_bed import Gateway, _patient_lookup, _until_healthy, settled
from tests.router.orchestration.agents import FakeAgent
from tests.router.orchestration.pods import FakeLlama, base_url, serve_app

TOKEN = "orchestration-test-token"


@dataclass
class Pod:
    llama: FakeLlama
    agent: FakeAgent
    url: str
    agent_url: str

    @property
    def spec(self) -> str:
        return f"{self.url}|{self.agent_url}"


@contextlib.asynccontextmanager
async def fake_pods(count: int, *, slots: int = 4) -> AsyncIterator[list[Pod]]:
    """`count` fake llama-servers, each with its fake agent; the agents know each other for pulls."""
    peers: dict[str, FakeAgent] = {}
    pods: list[Pod] = []
    async with contextlib.AsyncExitStack() as stack:
        for i in range(count):
            llama = FakeLlama(n_slots=slots)
            agent = FakeAgent(llama, TOKEN, peers, name=f"pod-{i}")
            pod_server = await serve_app(llama.app())
            stack.push_async_callback(pod_server.close)
            agent_server = await serve_app(agent.app())
            stack.push_async_callback(agent_server.close)
            agent.url = base_url(agent_server)
            peers[agent.url] = agent
            pods.append(Pod(llama, agent, base_url(pod_server), agent.url))
        yield pods


@contextlib.asynccontextmanager
async def gateway_over(pods: list[Pod], redis_url: str, *, prefix: str, **overrides: Any,
                       ) -> AsyncIterator[Gateway]:
    """The gateway over `pods` with snapshots on; `overrides` are more RouterSettings."""
    workdir = Path(tempfile.mkdtemp(prefix="orchestration-"))
    settings = RouterSettings(
        pods=[p.spec for p in pods], redis_url=redis_url, poll_interval=0.5,
        index_ping_interval=0.2, config_file=_patient_lookup(workdir), agent_token=SecretStr(TOKEN),
        expose_routing_headers=True, **overrides)
    client = connect_index(redis_url)
    index, leases = RedisPrefixIndex(client, prefix=prefix), RedisSlotLeases(client, prefix=prefix)

    def discovery(http: httpx.AsyncClient, fence: FenceHook) -> Discovery:
        return StaticDiscovery(settings.pod_specs, http, poll_interval=0.5, fence=fence)

    # No `http`: the lifespan makes the production client (httpx plus the proxy's aiohttp session).
    app = create_app(settings, index=index, leases=leases, discovery=discovery)
    try:
        async with serve(app) as url:
            await _until_healthy(url)
            yield Gateway(url, app, index, leases)
    finally:
        await client.aclose()
        shutil.rmtree(workdir, ignore_errors=True)


async def assert_idle(gw: Gateway, pods: list[Pod]) -> None:
    """Nothing left in flight (the gateway's count and its /metrics gauge), no after-response task, no
    slot claimed here or leased in Redis."""
    await settled(gw, timeout=30.0)
    assert gw.app.state.gateway.in_flight.total() == 0
    async with httpx.AsyncClient(timeout=10.0) as http:
        text = (await http.get(gw.url + "/metrics")).text
    gauges = [line for line in text.splitlines() if line.startswith("llamafleet_router_in_flight{")]
    assert gauges and all(line.endswith(" 0.0") for line in gauges), gauges  # (a pod served: present)
    holders = [await gw.leases.holder(SlotRef(p.url, s)) for p in pods for s in range(p.llama.n_slots)]
    assert holders == [None] * len(holders), holders

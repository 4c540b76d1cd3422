"""Finding 3 (tokens): each namespace's agents accept only their own token, and the gateway sends each
agent its namespace's token, never the master and never another namespace's.

Before the fix one token, the same in every namespace, was mounted into every fleet pod, so one fleet
author held the credential of every agent of the installation. Real Redis holds the membership of two
fleets in two namespaces; real agents (on sockets) run with their namespace's derived token; the gateway
app runs its real lifespan (membership discovery bound to its snapshot tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.agent_tokens import namespace_token
from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.membership import Member, write_members
from llamafleet_local.redis_server import free_port
from llamafleet_router.app import create_app as create_gateway
from llamafleet_router.discovery.membership import MembershipDiscovery
from llamafleet_router.settings import RouterSettings
from tests.agent.test_app_offline import PropsOnly

MASTER = "the-release-master-agent-token-0123456789"

pytestmark = pytest.mark.redis


@contextlib.asynccontextmanager
async def agent(workdir: Path, token: str) -> AsyncIterator[int]:
    """A real agent on a free port accepting `token` only; yields its port."""
    settings = AgentSettings(snapshot_dir=workdir / "snapshots", model_sha256="c" * 64, slots=1,
                             pod_name=workdir.name)
    async with httpx.AsyncClient() as http:
        app = create_app(settings, llama=PropsOnly(), http=http, registry=CollectorRegistry(), token=token)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                assert not task.done(), "the agent did not start"
                await asyncio.sleep(0.02)
            yield port
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 15)


def member(name: str, agent_port: int) -> Member:
    return Member(name=name, uid=f"uid-{name}", ip="127.0.0.1", port=free_port(), agent_port=agent_port,
                  slots=1, model="m", ready=True, epoch=1)


async def test_the_gateway_presents_each_namespace_its_own_agent_token(
        tmp_path: Path, redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with (
        agent(tmp_path / "a-0", namespace_token(MASTER, "team-a")) as port_a,
        agent(tmp_path / "b-0", namespace_token(MASTER, "team-b")) as port_b,
        httpx.AsyncClient(timeout=10.0) as http,
    ):
        redis = aioredis.Redis.from_url(redis_url)
        try:
            await write_members(redis, "team-a", "f", [member("a-0", port_a)], prefix=prefix)
            await write_members(redis, "team-b", "g", [member("b-0", port_b)], prefix=prefix)
            settings = RouterSettings(discovery="redis", redis_url=redis_url, index="memory",
                                      agent_token=MASTER, poll_interval=60.0)
            app = create_gateway(
                settings, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(), http=http,
                registry=CollectorRegistry(),
                discovery=lambda client, fence: MembershipDiscovery(
                    redis, [], client, poll_interval=60.0, fence=fence, prefix=prefix, startup_timeout=2.0,
                    member_networks=["127.0.0.0/8"]))
            async with app.router.lifespan_context(app):
                config = app.state.gateway.snapshot_config
                url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
                token_a, token_b = config.agent_token(url_a), config.agent_token(url_b)
                assert token_a == namespace_token(MASTER, "team-a") != token_b
                assert MASTER not in (token_a, token_b)
                assert config.agent_token("http://127.0.0.1:1") == "", "not in the membership: no token"

                assert await AgentClient(url_a, http, token_a).list() == []
                assert await AgentClient(url_b, http, token_b).list() == []
                for url, token in ((url_b, token_a), (url_a, token_b), (url_a, MASTER)):
                    with pytest.raises(AgentError) as refused:
                        await AgentClient(url, http, token).list()
                    assert refused.value.status == 401
        finally:
            await redis.aclose()

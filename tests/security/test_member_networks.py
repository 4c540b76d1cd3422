"""Finding 6 (the gateway's side): whoever can write the fleet membership in Redis must not choose where
prompts and the agent token go. (And a pull is never sourced from another namespace's agent.)

A member's address is free text in Redis. The gateway now accepts a member only when its `ip` is an IP
literal inside `member_networks` (default: the private ranges) and its ports are ports; any other is
ignored, logged and shown by `llamafleet_router_members_ignored{reason}`. So it is never polled, never
sent a prompt, and its agent is never placed (no token is ever presented there).

A real `llamafleet router` process over a real Redis, with members pointing at a loopback stub (outside
the default networks), at a URL smuggled into the `ip` field, at the cloud metadata address and at an
invalid port: the stub sees nothing. The control run, with loopback allowed, shows the same stub is
contacted at once, so the check is what kept it out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from llamafleet_core.agent_tokens import AgentTokens
from llamafleet_core.membership import Member, write_members
from llamafleet_core.networks import PRIVATE_NETWORKS, parse_networks
from llamafleet_core.types import Endpoint, PodRef
from llamafleet_local.redis_server import free_port
from llamafleet_router.discovery.addresses import refusal
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.snapshots.peers import peer_agents
from llamafleet_testbed.reliability.bed import until
from tests.security.peer_stub import Stub, stub_server

NS = "tenant-a"


def member(name: str, ip: str, port: int, agent_port: int) -> Member:
    return Member(name=name, uid=f"uid-{name}", ip=ip, port=port, agent_port=agent_port, slots=2,
                  model="tiny", ready=True, epoch=1)


def members(stub: Stub) -> list[Member]:
    return [member("loopback", "127.0.0.1", stub.port, stub.port),
            member("smuggled", "collector.attacker.example:443/x?", stub.port, stub.port),
            member("metadata", "169.254.169.254", 80, 80),
            member("bad-port", "10.0.0.7", 70000, 8081)]


def test_a_member_is_accepted_only_on_an_ip_literal_of_the_networks_with_real_ports() -> None:
    private = parse_networks(PRIVATE_NETWORKS)
    assert refusal(member("ok", "10.244.1.5", 8080, 8081), private) is None
    assert refusal(member("v6", "fd00::5", 8080, 8081), private) is None
    assert member("v6", "fd00::5", 8080, 8081).url == "http://[fd00::5]:8080"
    for ip in ("127.0.0.1", "169.254.169.254", "8.8.8.8", "pod-0.example", "10.0.0.1:80/x?", "", "::1"):
        assert refusal(member("x", ip, 8080, 8081), private) == "address", ip
    assert refusal(member("x", "10.0.0.1", 0, 8081), private) == "port"
    assert refusal(member("x", "127.0.0.1", 8080, 8081), parse_networks(["127.0.0.0/8"])) is None


def pod(uid: str, agent_url: str | None) -> PodStatus:
    endpoint = Endpoint(pod=PodRef(name=uid, uid=uid, epoch=1), url=f"http://{uid}:8080", model="tiny",
                        n_slots=2, agent_url=agent_url)
    return PodStatus(endpoint=endpoint, props=None)


def test_a_pull_source_is_only_ever_an_agent_of_the_targets_own_namespace() -> None:
    """The target agent presents its own namespace's token to the source: the gateway never names an
    agent of another namespace (another tenant's pod), nor one the membership does not place."""
    tokens = AgentTokens("master", per_namespace=True)
    a1, a2, b1 = "http://10.0.0.1:8081", "http://10.0.0.2:8081", "http://10.0.1.1:8081"
    tokens.place({a1: "team-a", a2: "team-a", b1: "team-b"})
    pods = [pod("a1", a1), pod("a2", a2), pod("b1", b1), pod("stray", "http://10.0.9.9:8081"),
            pod("none", None)]
    assert peer_agents(pods, pods[0].endpoint, tokens) == {"a1": a1, "a2": a2}
    assert peer_agents(pods, pods[2].endpoint, tokens) == {"b1": b1}
    assert peer_agents(pods, pods[3].endpoint, tokens) == {}  # an unplaced target pulls from nobody
    static = AgentTokens("master")  # one token for all (`llamafleet up`): every agent is a peer
    assert set(peer_agents(pods, pods[0].endpoint, static)) == {"a1", "a2", "b1", "stray"}


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    async with stub_server() as s:
        yield s


@contextlib.contextmanager
def router(redis_url: str, fleet: str, tmp_path: Path, **env: str) -> Iterator[str]:
    """`llamafleet router --discovery redis` for `fleet`, with snapshots on (an agent token); its URL."""
    port = free_port()
    log = tmp_path / f"router-{port}.log"
    variables = {**os.environ, "LLAMAFLEET_ROUTER_DISCOVERY": "redis", "LLAMAFLEET_ROUTER_FLEETS": fleet,
                 "LLAMAFLEET_ROUTER_REDIS_URL": redis_url, "LLAMAFLEET_ROUTER_POLL_INTERVAL": "0.2",
                 "LLAMAFLEET_ROUTER_AGENT_TOKEN": "master-token-of-the-gateway-0123456789", **env}
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "llamafleet_cli.cli", "router", "--host", "127.0.0.1",
                "--port", str(port)]
        proc = subprocess.Popen(argv, env=variables, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def ignored(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    try:
        text = (await http.get(url + "/metrics", timeout=2.0)).text
    except httpx.HTTPError:
        return {}
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "llamafleet_router_members_ignored"}


@pytest.mark.redis
async def test_members_outside_the_networks_are_never_contacted(
    redis_url: str, stub: Stub, tmp_path: Path,
) -> None:
    fleet = f"fleet-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_url)
    try:
        await write_members(client, NS, fleet, members(stub))
        async with httpx.AsyncClient() as http:
            with router(redis_url, f"{NS}/{fleet}", tmp_path) as url:
                async def decided() -> bool:
                    # The gauge is set by the refresh that ignored them; a member added would be polled.
                    return bool(stub.seen) or await ignored(http, url) == {"address": 3.0, "port": 1.0}

                assert await until(decided, 60.0, every=0.1) is not None
                assert stub.seen == [], f"a member outside member_networks was contacted: {stub.paths()}"
                for _ in range(3):  # requests find no pod: none was admitted
                    resp = await http.post(url + "/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "my secret prompt"}]})
                    assert resp.status_code in (404, 503), resp.text  # no pod serves it
            assert stub.seen == [], f"a member outside member_networks was contacted: {stub.paths()}"

            # Control: the same membership, loopback allowed: the stub is polled at once.
            loopback = {"LLAMAFLEET_ROUTER_MEMBER_NETWORKS": "127.0.0.0/8"}
            with router(redis_url, f"{NS}/{fleet}", tmp_path, **loopback):
                async def contacted() -> bool:
                    return bool(stub.seen)

                assert await until(contacted, 60.0, every=0.1) is not None
    finally:
        await client.aclose()

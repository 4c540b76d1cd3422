"""Membership discovery: the watched pods follow the fleet membership in Redis (real Redis, fake pods)."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from llamafleet_core.membership import Member, write_members
from llamafleet_core.types import PodRef
from llamafleet_local.redis_server import RedisServer
from llamafleet_router.discovery.base import Discovery
from llamafleet_router.discovery.membership import MembershipDiscovery, parse_fleet, wanted_specs
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.settings import RouterSettings
from tests.router.fakes import FakeFleet, FakePod


def member(i: int, *, ready: bool = True) -> Member:
    return Member(name=f"pod-{i}", uid=f"uid-{i}", ip=f"10.0.0.{i}", port=8080, agent_port=8090, slots=2,
                  model="tiny", ready=ready, epoch=1000 + i)


def fake_fleet(*ids: int) -> FakeFleet:
    fleet = FakeFleet(*(FakePod(member(i).url) for i in ids))
    for i in ids:
        fleet.agents_ready[member(i).agent_url] = True
    return fleet


def test_wanted_specs_are_ready_members_with_agent_urls() -> None:
    """Not-ready members (readiness gate: prefixes not warm yet) are not routed to."""
    specs = wanted_specs([member(1), member(2, ready=False)])
    assert specs == {"http://10.0.0.1:8080": PodSpec("http://10.0.0.1:8080", "http://10.0.0.1:8090")}
    assert parse_fleet("ns/f") == ("ns", "f")
    with pytest.raises(ValueError):
        parse_fleet("nofleet")


def test_settings_parse_discovery_and_fleets_when_given_as_env_text() -> None:
    s = RouterSettings(discovery="redis", fleets="a/x, b/y", redis_url="redis://127.0.0.1:1/0")  # type: ignore[arg-type]
    assert (s.discovery, s.fleets) == ("redis", ["a/x", "b/y"])
    with pytest.raises(ValueError):
        RouterSettings(discovery="redis")
    with pytest.raises(ValueError):
        RouterSettings(fleets="bad")  # type: ignore[arg-type]


@pytest.mark.redis
async def test_pods_follow_membership_when_members_join_and_leave(redis: aioredis.Redis) -> None:
    """Members appear in endpoints() once written; a member that left vanishes at once (and is
    fenced); a pod still there keeps its identity and epoch."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    fleet = fake_fleet(1, 2, 3)
    fenced: list[PodRef] = []

    async def fence(old: PodRef) -> None:
        fenced.append(old)

    await write_members(redis, "ns", "f", [member(1), member(2)], prefix=prefix)
    async with fleet.client() as http:
        disc = MembershipDiscovery(redis, ["ns/f"], http, poll_interval=60, fence=fence, prefix=prefix)
        assert isinstance(disc, Discovery)
        await disc.start()
        try:
            before = {s.endpoint.url: s for s in await disc.endpoints()}
            assert set(before) == {member(1).url, member(2).url}
            assert all(s.ready for s in before.values())
            assert before[member(1).url].endpoint.agent_url == member(1).agent_url

            gone = disc.gone(member(2).url)
            await write_members(redis, "ns", "f", [member(1), member(3)], prefix=prefix)
            await disc.poll_once()
            after = {s.endpoint.url: s for s in await disc.endpoints()}
            assert set(after) == {member(1).url, member(3).url}
            assert after[member(3).url].ready
            assert after[member(1).url].endpoint.pod == before[member(1).url].endpoint.pod
            assert gone.is_set()
            assert [ref.uid for ref in fenced] == [member(2).url]
        finally:
            await disc.stop()


@pytest.mark.redis
async def test_all_fleets_are_served_when_no_fleet_is_configured(redis: aioredis.Redis) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    await write_members(redis, "a", "x", [member(1)], prefix=prefix)
    await write_members(redis, "b", "y", [member(2), member(3, ready=False)], prefix=prefix)
    async with fake_fleet(1, 2, 3).client() as http:
        disc = MembershipDiscovery(redis, [], http, poll_interval=60, prefix=prefix)
        await disc.start()
        try:
            assert {s.endpoint.url for s in await disc.endpoints()} == {member(1).url, member(2).url}
        finally:
            await disc.stop()


@pytest.mark.redis
async def test_last_known_pods_are_kept_when_redis_is_down(redis_server: RedisServer) -> None:
    """A Redis outage must not empty the fleet: the pods keep being polled and routed to."""
    client = aioredis.Redis.from_url(redis_server.url, socket_connect_timeout=1, socket_timeout=1)
    try:
        await write_members(client, "ns", "f", [member(1), member(2)])
        async with fake_fleet(1, 2).client() as http:
            disc = MembershipDiscovery(client, ["ns/f"], http, poll_interval=60)
            await disc.start()
            try:
                redis_server.stop()
                assert await disc.refresh() is False
                await disc.poll_once()  # must not raise
                statuses = await disc.endpoints()
                assert {s.endpoint.url for s in statuses} == {member(1).url, member(2).url}
                assert all(s.ready for s in statuses)
            finally:
                await disc.stop()
    finally:
        await client.aclose()


async def test_static_add_and_remove_change_the_watched_pods_when_started() -> None:
    """`add` of a known URL is a no-op; `remove` of an unknown one too."""
    fleet = FakeFleet(FakePod("http://p1:8080"), FakePod("http://p2:8080"))
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec("http://p1:8080")], http, poll_interval=60)
        await disc.start()
        try:
            disc.add(PodSpec("http://p2:8080"))
            disc.add(PodSpec("http://p2:8080"))
            await disc.poll_once()
            assert [s.endpoint.url for s in await disc.endpoints()] == ["http://p1:8080", "http://p2:8080"]
            assert all(s.ready for s in await disc.endpoints())
            await disc.remove("http://p1:8080")
            await disc.remove("http://nope:1")
            assert [s.endpoint.url for s in await disc.endpoints()] == ["http://p2:8080"]
        finally:
            await disc.stop()

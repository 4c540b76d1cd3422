"""Which pods run the patched `--slot-attach` reaches the router's endpoints: from the membership the
operator writes (real Redis), and from a static pod list (`url|agent_url|attach`). Scheduling is not under
test here; only that `Endpoint.attach` is what the pod really runs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from llamafleet_core.membership import Member, decode, encode, write_members
from llamafleet_router.discovery.membership import MembershipDiscovery, wanted_specs
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import app_client
from llamafleet_router.settings import RouterSettings
from tests.router.fakes import FakeFleet, FakePod


def member(i: int, *, attach: bool, cache_prefix: bool = False) -> Member:
    return Member(name=f"pod-{i}", uid=f"uid-{i}", ip=f"10.0.0.{i}", port=8080, agent_port=8090, slots=2,
                  model="tiny", ready=True, epoch=1000 + i, attach=attach, cache_prefix=cache_prefix)


def test_static_pod_list_accepts_a_field_of_patched_flags() -> None:
    settings = RouterSettings(pods="http://a:1|http://a:2|attach,http://b:1||attach+cache-prefix,"
                                   "http://c:1,http://d:1||cache-prefix")
    assert settings.pod_specs == [
        PodSpec("http://a:1", "http://a:2", True), PodSpec("http://b:1", None, True, cache_prefix=True),
        PodSpec("http://c:1"), PodSpec("http://d:1", None, False, cache_prefix=True)]
    with pytest.raises(ValueError, match="may only list attach, cache-prefix: 'yes'"):
        PodSpec.parse("http://a:1|http://a:2|yes")
    with pytest.raises(ValueError, match="'cache_prefix'"):
        RouterSettings(pods="http://a:1||attach+cache_prefix")


def test_wanted_specs_carry_each_members_patched_flags() -> None:
    specs = wanted_specs([member(1, attach=True, cache_prefix=True), member(2, attach=False)])
    assert [(s.attach, s.cache_prefix) for s in specs.values()] == [(True, True), (False, False)]


def test_a_members_cache_prefix_flag_survives_its_record() -> None:
    entry = member(3, attach=True, cache_prefix=True)
    assert decode(encode(entry)) == entry and decode(encode(entry)).endpoint().cache_prefix
    assert not decode(encode(member(4, attach=True))).cache_prefix


@pytest.mark.redis
async def test_endpoint_attach_follows_membership_when_the_operator_learns_it(redis_url: str) -> None:
    """A watched pod keeps its epoch while its attach flag is updated in place."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    fleet = FakeFleet(FakePod(member(1, attach=False).url))
    fleet.agents_ready[member(1, attach=False).agent_url] = True
    client = aioredis.Redis.from_url(redis_url)
    try:
        await write_members(client, "ns", "f", [member(1, attach=False)], prefix=prefix)
        async with fleet.client() as http:
            disc = MembershipDiscovery(client, ["ns/f"], http, poll_interval=60, prefix=prefix)
            await disc.start()
            try:
                await disc.poll_once()
                (before,) = await disc.endpoints()
                assert before.ready and before.endpoint.attach is False
                await write_members(client, "ns", "f", [member(1, attach=True)], prefix=prefix)
                await disc.poll_once()
                (after,) = await disc.endpoints()
                assert after.endpoint.attach is True and after.endpoint.uid == before.endpoint.uid
            finally:
                await disc.stop()
    finally:
        await client.aclose()


async def test_static_endpoint_reports_attach_from_its_spec() -> None:
    fleet = FakeFleet(FakePod("http://p1:8080"))
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec("http://p1:8080", None, True)], http, poll_interval=60)
        await disc.start()
        try:
            (status,) = await disc.endpoints()
            assert status.ready and status.endpoint.attach is True
        finally:
            await disc.stop()


async def test_health_lists_each_pods_attach_flag(make_app: Any) -> None:
    """Operators can see which pods the router believes share prefixes across slots."""
    async with app_client(make_app()) as client:
        pods = (await client.get("/health")).json()["pods"]
    assert pods and all(pod["attach"] is False for pod in pods)

"""Fleet membership in Redis: what the operator writes is what a router reads."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from llamafleet_core import membership
from llamafleet_core.membership import Member

A = Member("tiny-0", "uid-a", "10.0.0.1", 8080, 8090, 4, "m", True, 1700000000000, warm=("p",))
B = Member("tiny-1", "uid-b", "10.0.0.2", 8080, 8090, 4, "m", False, 1700000001000)


def test_member_round_trips_and_becomes_an_endpoint() -> None:
    assert membership.decode(membership.encode(A)) == A
    ep = A.endpoint()
    assert (ep.url, ep.agent_url, ep.pod.uid, ep.pod.epoch, ep.n_slots, ep.ready) == (
        "http://10.0.0.1:8080", "http://10.0.0.1:8090", "uid-a", 1700000000000, 4, True)


@pytest.mark.redis
async def test_membership_replaced_whole_when_pods_change(redis_url: str) -> None:
    """A pod that left is gone from the hash at once; an unchanged write notifies nobody."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await membership.write_members(client, "ns", "f", [A, B], prefix=prefix)
        assert await membership.read_members(client, "ns", "f", prefix=prefix) == [A, B]
        assert not await membership.write_members(client, "ns", "f", [B, A], prefix=prefix)
        assert await membership.write_members(client, "ns", "f", [B], prefix=prefix)
        assert await membership.read_members(client, "ns", "f", prefix=prefix) == [B]
        assert await membership.list_fleets(client, prefix=prefix) == [("ns", "f")]
        await client.hset(membership.members_key("ns", "f", prefix), "junk", "{not json")
        assert await membership.read_members(client, "ns", "f", prefix=prefix) == [B]
        await membership.remove_fleet(client, "ns", "f", prefix=prefix)
        assert await membership.read_members(client, "ns", "f", prefix=prefix) == []
        assert await membership.list_fleets(client, prefix=prefix) == []
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_an_older_operators_untagged_membership_is_read_until_the_first_write(redis_url: str) -> None:
    """Keys written before the hash tag (`P:members:F`, `P:fleets`) keep routers routing across an
    upgrade in either order; the first tagged write deletes them, and a removed fleet stays removed."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.hset(f"{prefix}:members:ns/old", A.uid, membership.encode(A))
        await client.sadd(f"{prefix}:fleets", "ns/old")
        assert await membership.read_members(client, "ns", "old", prefix=prefix) == [A]
        assert await membership.list_fleets(client, prefix=prefix) == [("ns", "old")]
        assert not await membership.write_members(client, "ns", "old", [A], prefix=prefix)  # same pods
        assert await client.exists(f"{prefix}:members:ns/old", f"{prefix}:fleets") == 0
        assert await membership.read_members(client, "ns", "old", prefix=prefix) == [A]
        await client.hset(f"{prefix}:members:ns/old", B.uid, membership.encode(B))  # a stale writer
        await membership.remove_fleet(client, "ns", "old", prefix=prefix)
        assert await membership.read_members(client, "ns", "old", prefix=prefix) == []
        assert await membership.list_fleets(client, prefix=prefix) == []
    finally:
        await client.aclose()

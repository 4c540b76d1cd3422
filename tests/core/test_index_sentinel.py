"""The index and the leases through Redis Sentinel (sentinel.py): URLs, and a real master, replica and
three Sentinels whose master is killed (tests/fixtures/redis_ha.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.redis_conn import connect, connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.index.resp import Address, RespClient, redacted_url
from llamafleet_core.index.sentinel import DEFAULT_SENTINEL_PORT, parse_sentinel_url
from llamafleet_core.types import SlotRef
from tests.fixtures.redis_ha import SERVICE, SentinelDeployment

BLOCKS = [f"b{i}" for i in range(8)]
FAILOVER_LIMIT_S = 30.0  # down after 0.5 s, then the Sentinels' vote and the promotion: a few seconds


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_masters_login() -> None:
    found = parse_sentinel_url("redis+sentinel://app:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/"
                               "index/2?sentinel_password=watch")
    assert found.sentinels.nodes == (
        ("10.0.0.1", 26380), ("sentinel-b", DEFAULT_SENTINEL_PORT), ("::1", 26381))
    assert (found.sentinels.service, found.sentinels.password) == ("index", "watch")
    assert (found.db, found.username, found.password) == (2, "app", "s@cret")
    assert Address.from_url("redis+sentinel://h:1/svc").sentinels is not None


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel:///svc", "at least one Sentinel"),
    ("redis+sentinel://h:1", "names the service"),
    ("redis+sentinel://h:x/svc", "bad Sentinel port"),
    ("redis+sentinel://h:70000/svc", "bad Sentinel port"),
    ("redis+sentinel://h:1/svc/two", "bad database number"),
    ("redis+sentinel://h:1/svc?retries=3", "unsupported Sentinel URL option"),
])
def test_a_sentinel_url_it_cannot_use_is_refused_by_name(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Address.from_url(url)


def test_passwords_in_sentinel_and_option_urls_are_redacted() -> None:
    assert redacted_url("redis+sentinel://:pw@h:1,g:2/svc?sentinel_password=sp&db=1") == (
        "redis+sentinel://:***@h:1,g:2/svc?sentinel_password=***&db=1")
    assert redacted_url("redis://h:6379/0?password=pw") == "redis://h:6379/0?password=***"


@pytest.mark.redis
async def test_a_replica_refusing_a_write_fails_it_as_redis_down_and_closes_the_connection(
        sentinel_deployment: SentinelDeployment) -> None:
    """READONLY (a master demoted under an open connection) is no script error: the command fails as
    unreachable, so the router routes without the index, and the next command dials again."""
    client = RespClient.from_url(f"redis://127.0.0.1:{sentinel_deployment.replica.port}/0")
    try:
        with pytest.raises(ConnectionError, match="replica"):
            await client.execute("SET", "k", "v")
        assert client._conn is None or client._conn.closed
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_the_index_follows_a_failover_and_keeps_what_was_replicated(
        sentinel_deployment: SentinelDeployment) -> None:
    """Records, then the master is killed: operations fail fast (IndexUnavailable, never a hang) while
    the Sentinels fail over, then go to the promoted replica, which holds what was recorded; leases and
    the redis-py client of membership follow too."""
    url = sentinel_deployment.url
    index_client, lease_client = connect_index(url), connect_index(url)
    index = RedisPrefixIndex(index_client, prefix="ha")
    leases = RedisSlotLeases(lease_client, prefix="ha")
    members = connect(url, timeout_s=1.0)
    old_master = sentinel_deployment.master_port()
    try:
        slot = SlotRef("pod-a", 0)
        await index.record_slot("m", slot, BLOCKS, 1000)
        assert await leases.acquire(slot, "replica-1", 30.0)
        await members.set("ha:member", "pod-a")
        sentinel_deployment.replicated()

        sentinel_deployment.master.stop()
        unavailable = 0
        deadline = time.monotonic() + FAILOVER_LIMIT_S
        while True:
            started = time.monotonic()
            try:
                found = await index.lookup("m", BLOCKS)
                break
            except IndexUnavailable:
                unavailable += 1
                assert time.monotonic() - started < 2.5, "an index operation hung on the dead master"
                assert time.monotonic() < deadline, "no failover within the limit"
                await asyncio.sleep(0.1)
        assert unavailable > 0  # the lookups right after the kill met the dead master
        assert found.slots == {slot: len(BLOCKS)}
        assert sentinel_deployment.master_port() == sentinel_deployment.replica.port != old_master
        # the lease taken before the failover is still held, and new writes land on the new master
        assert not await leases.acquire(slot, "replica-2", 30.0)
        await index.record_slot("m", SlotRef("pod-b", 1), BLOCKS[:4], 500)
        assert SlotRef("pod-b", 1) in (await index.lookup("m", BLOCKS[:4])).slots
        assert await _eventually_read(members, "ha:member") == b"pod-a"
    finally:
        await index_client.aclose()
        await lease_client.aclose()
        await members.aclose()


async def _eventually_read(client: aioredis.Redis, key: str) -> bytes | None:
    """redis-py's master client re-asks the Sentinels on a new connection: its first command after the
    failover may still meet the dead master's pooled connection."""
    for _ in range(50):
        try:
            value: bytes | None = await client.get(key)
            return value
        except (ConnectionError, OSError, aioredis.RedisError):
            await asyncio.sleep(0.1)
    raise AssertionError(f"membership client never read {key} after the failover ({SERVICE})")

"""What only the Redis index can get wrong: round trips, its key schema, outages, and agreement with
the in-memory index on a random workload."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from llamafleet_core.index import IndexUnavailable, InMemoryPrefixIndex
from llamafleet_core.index.redis_conn import connect, connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.index.resp import RespClient
from llamafleet_core.types import SlotRef, SnapshotRef
from llamafleet_local.redis_server import RedisServer
from tests.core.test_index_contract import chain, text

pytestmark = pytest.mark.redis
MODEL = "qwen2-tiny"


class CountingClient(RespClient):
    """Counts the commands put on the wire."""

    sent = 0

    async def execute(self, *args: Any, asking: bool = False) -> Any:
        CountingClient.sent += 1
        return await super().execute(*args, asking=asking)


def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def test_lookup_is_one_round_trip_when_chain_is_long(redis_url: str) -> None:
    """A 240-block lookup over 1,000 slot entries is one request on the wire and one EVALSHA on the server."""
    client = connect(redis_url)
    counting = CountingClient.from_url(redis_url)
    try:
        index = RedisPrefixIndex(counting, prefix=prefix())
        blocks = chain(text(240, "long"))
        for i in range(1000):
            await index.record_slot(MODEL, SlotRef(f"pod-{i // 8}@1", i % 8), blocks[: 1 + i % 240], 1)
        await index.lookup(MODEL, blocks)  # the first call may load the script (NOSCRIPT, LOAD, EVALSHA)
        before = await client.info("commandstats")
        CountingClient.sent = 0
        found = await index.lookup(MODEL, blocks)
        sent = CountingClient.sent
        after = await client.info("commandstats")
        assert sent == 1
        assert after["cmdstat_evalsha"]["calls"] - before["cmdstat_evalsha"]["calls"] == 1
        assert len(found.slots) == 1000
        assert found.slots[SlotRef("pod-0@1", 5)] == 6
        assert found.best_slot_blocks() == 240
    finally:
        await client.aclose()
        await counting.aclose()


async def test_record_slot_leaves_no_stale_membership_when_content_changes(
    client: aioredis.Redis, rc: RespClient
) -> None:
    """Replacing a slot's chain removes it from the old blocks' sets in Redis itself, not just from
    answers, and the slot hash holds the new chain."""
    p = prefix()
    index = RedisPrefixIndex(rc, prefix=p)
    old, new = chain(text(5, "old")), chain(text(3, "new"))
    slot = SlotRef("pod-a@1", 2)
    await index.record_slot(MODEL, slot, old, 40)
    await index.record_slot(MODEL, slot, old[:2] + new, 40)
    for h in old[2:]:
        assert await client.exists(f"{p}:{{{MODEL}}}:b:{h}") == 0
    assert await client.zscore(f"{p}:{{{MODEL}}}:b:{old[0]}", slot.key()) is not None
    assert await client.hget(f"{p}:{{{MODEL}}}:slot:{slot.key()}", "n_tokens") == b"40"


async def test_keys_vanish_from_redis_when_ttl_passes(client: aioredis.Redis, rc: RespClient) -> None:
    """Expiry is real garbage collection: every key the index wrote disappears on its own."""
    p = prefix()
    index = RedisPrefixIndex(rc, prefix=p, slot_ttl_s=0.3, snapshot_ttl_s=0.3)
    blocks = chain(text(4, "gc"))
    await index.record_slot(MODEL, SlotRef("pod-a@1", 0), blocks, 32)
    await index.record_snapshot(MODEL, SnapshotRef("s", "pod-a@1", 4, 32, 1), blocks)
    # 4 block sets, the slot hash, the snapshot set, snaplast, the catalog and the pod set (P:models stays)
    assert len(await client.keys(f"{p}:*")) == 4 + 5 + 1
    models = f"{p}:models"  # the names of the models that had entries: no TTL, by design
    for _ in range(30):
        if await client.keys(f"{p}:*") == [models.encode()]:
            break
        await asyncio.sleep(0.1)
    assert await client.keys(f"{p}:*") == [models.encode()]


async def test_agrees_with_memory_index_when_workload_is_random(rc: RespClient) -> None:
    """The same random sequence of writes gives the same lookups in Redis and in memory."""
    rng = random.Random(7)
    redis_index = RedisPrefixIndex(rc, prefix=prefix())
    memory_index = InMemoryPrefixIndex()
    trunk = text(40, "trunk")
    chains = [chain(trunk[: 8 * rng.randint(0, 40)] + text(rng.randint(1, 20), f"b{i}")) for i in range(12)]
    slots = [SlotRef(f"pod-{i}@1", s) for i in range(4) for s in range(3)]
    for step in range(150):
        op = rng.random()
        slot, blocks = rng.choice(slots), rng.choice(chains)
        n = rng.randint(1, len(blocks))
        for idx in (redis_index, memory_index):
            if op < 0.6:
                await idx.record_slot(MODEL, slot, blocks[:n], 1)
            elif op < 0.7:
                await idx.forget_slot(MODEL, slot)
            elif op < 0.85:
                ref = SnapshotRef(f"s{step % 5}", slot.pod_uid, n, n, 1)
                await idx.record_snapshot(MODEL, ref, blocks[:n])
            elif op < 0.9:
                await idx.purge_pod(slot.pod_uid)
            else:
                await idx.forget_snapshot(MODEL, f"s{step % 5}", slot.pod_uid)
        query = rng.choice(chains)
        got, want = await redis_index.lookup(MODEL, query), await memory_index.lookup(MODEL, query)
        assert got == want, f"step {step}"
    assert await redis_index.snapshots(MODEL) == await memory_index.snapshots(MODEL)


async def test_raises_index_unavailable_promptly_when_server_dies_and_recovers(
    redis_server: RedisServer,
) -> None:
    """Killed server: every operation fails fast with IndexUnavailable and ping is False; once the
    server is back (empty, no persistence), the same objects work again without being rebuilt."""
    index = RedisPrefixIndex.from_url(redis_server.url)
    lease_client = connect_index(redis_server.url)
    leases = RedisSlotLeases(lease_client)
    blocks = chain(text(6, "outage"))
    slot = SlotRef("pod-a@1", 0)
    try:
        await index.record_slot(MODEL, slot, blocks, 48)
        assert (await index.lookup(MODEL, blocks)).slots == {slot: 6}
        redis_server.stop()
        for op in (
            lambda: index.lookup(MODEL, blocks),
            lambda: index.record_slot(MODEL, slot, blocks, 48),
            lambda: index.purge_pod("pod-a@1"),
            lambda: leases.acquire(slot, "r1", 5),
        ):
            started = time.monotonic()
            with pytest.raises(IndexUnavailable):
                await op()
            assert time.monotonic() - started < 2.0
        assert not await index.ping()

        redis_server.start()
        for _ in range(100):
            if await index.ping():
                break
            await asyncio.sleep(0.1)
        assert (await index.lookup(MODEL, blocks)).slots == {}  # a fresh server knows nothing
        await index.record_slot(MODEL, slot, blocks, 48)  # scripts are reloaded after NOSCRIPT
        assert (await index.lookup(MODEL, blocks)).slots == {slot: 6}
        assert await leases.acquire(slot, "r1", 5)
    finally:
        await index.close()
        await lease_client.aclose()


async def test_lookup_agrees_with_memory_when_every_slot_has_its_own_run_length(rc: RespClient) -> None:
    """Many distinct run lengths make the Lua lookup search per slot instead of diffing member lists;
    both strategies must give the in-memory answer, including slots diverging mid-chain."""
    redis_index = RedisPrefixIndex(rc, prefix=prefix())
    memory_index = InMemoryPrefixIndex()
    base = text(120, "runs")
    query = chain(base)
    for i in range(150):
        slot = SlotRef(f"pod-{i // 4}@1", i % 4)
        cut = 1 + (i * 7) % 120
        blocks = chain(base[: 8 * cut] + text(3, f"t{i}")) if i % 3 == 0 else query[:cut]
        for idx in (redis_index, memory_index):
            await idx.record_slot(MODEL, slot, blocks, cut)
    for q in (query, query[:60], query[:1], chain(base[:400] + text(20, "q"))):
        got, want = await redis_index.lookup(MODEL, q), await memory_index.lookup(MODEL, q)
        assert got == want
    assert len(set((await redis_index.lookup(MODEL, query)).slots.values())) > 50

"""How the Redis index keeps a slot's chain, and what its scripts touch to read and rewrite one.

A chain is stored as one string of fixed-width hashes. A re-record finds the prefix the old and new
chains share with string comparisons and diffs only the tails; a lookup cuts the query into hashes only
where it needs one, and finds the snapshot ends in the query string when a model has few. Records
written before chains were strings (a JSON list) are still read, and replaced on the next write.
The commands a script runs show in Redis' own `INFO commandstats`."""

from __future__ import annotations

import json
import uuid

import pytest
import redis.asyncio as aioredis

from llamafleet_core.index import InMemoryPrefixIndex
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.resp import RespClient
from llamafleet_core.types import SlotRef, SnapshotRef
from tests.core.test_index_contract import chain, text

pytestmark = pytest.mark.redis
MODEL = "qwen2-tiny"
SLOT = SlotRef("pod-a@1", 0)


@pytest.fixture
def p() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def calls(client: aioredis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


async def ran(client: aioredis.Redis, before: dict[str, int], *names: str) -> tuple[int, ...]:
    """How many times each command ran since `before` (in scripts too)."""
    after = await calls(client)
    return tuple(after.get(n, 0) - before.get(n, 0) for n in names)


def slot_key(p: str, slot: SlotRef = SLOT) -> str:
    return f"{p}:{{{MODEL}}}:slot:{slot.key()}"


async def members(client: aioredis.Redis, p: str, blocks: list[str]) -> list[bool]:
    return [await client.zscore(f"{p}:{{{MODEL}}}:b:{h}", SLOT.key()) is not None for h in blocks]


async def test_slot_hash_holds_its_chain_as_one_string(
    client: aioredis.Redis, rc: RespClient, p: str
) -> None:
    blocks = chain(text(6, "one"))
    await RedisPrefixIndex(rc, prefix=p).record_slot(MODEL, SLOT, blocks, 48)
    stored = await client.hgetall(slot_key(p))
    assert stored[b"chain"] == "".join(blocks).encode()
    assert stored[b"w"] == b"16"
    assert b"blocks" not in stored


async def test_next_turn_adds_only_its_tail_and_a_parting_one_drops_only_its_own(
    client: aioredis.Redis, rc: RespClient, p: str
) -> None:
    index, memory = RedisPrefixIndex(rc, prefix=p), InMemoryPrefixIndex()
    trunk = text(10, "trunk")
    first, longer, parted = chain(trunk), chain(trunk + text(3, "b")), chain(trunk + text(2, "c"))
    await index.record_slot(MODEL, SLOT, first, 80)
    before = await calls(client)
    await index.record_slot(MODEL, SLOT, longer, 104)
    assert await ran(client, before, "zadd", "zrem") == (3, 0)
    before = await calls(client)
    await index.record_slot(MODEL, SLOT, parted, 96)
    assert await ran(client, before, "zadd", "zrem") == (2, 3)
    assert await members(client, p, longer) == [True] * 10 + [False] * 3
    assert await members(client, p, parted) == [True] * 12
    await memory.record_slot(MODEL, SLOT, parted, 96)
    for query in (first, longer, parted):
        assert await index.lookup(MODEL, query) == await memory.lookup(MODEL, query)


async def test_record_past_a_tenth_of_its_ttl_refreshes_the_shared_prefix_too(
    client: aioredis.Redis, rc: RespClient, p: str
) -> None:
    index = RedisPrefixIndex(rc, prefix=p, slot_ttl_s=60)
    blocks = chain(text(8, "stale") + text(1, "next"))
    await index.record_slot(MODEL, SLOT, blocks[:8], 64)
    deadline = int(await client.hget(slot_key(p), "deadline") or 0)
    # As if recorded 10 s ago: its blocks expire within 0.9 of a TTL, and a next turn must extend them.
    await client.hset(slot_key(p), "deadline", deadline - 10_000)
    before = await calls(client)
    await index.record_slot(MODEL, SLOT, blocks, 72)
    # Every block's entry is written again; expired members are swept only from the set it joined.
    assert await ran(client, before, "zadd", "zrem", "zremrangebyscore") == (9, 0, 1)
    assert int(await client.hget(slot_key(p), "deadline") or 0) >= deadline
    scores = [await client.zscore(f"{p}:{{{MODEL}}}:b:{h}", SLOT.key()) for h in blocks]
    assert min(s for s in scores if s is not None) >= deadline and None not in scores


async def test_record_written_as_a_json_list_is_read_and_replaced(
    client: aioredis.Redis, rc: RespClient, p: str
) -> None:
    """A slot recorded by a gateway of the version before (blocks as a JSON list) during a rolling
    upgrade: the next record drops what it no longer holds, and purge_pod finds all it held."""
    index = RedisPrefixIndex(rc, prefix=p)
    old, new = chain(text(6, "legacy")), chain(text(4, "legacy") + text(2, "new"))
    other = SlotRef("pod-b@1", 1)
    for slot in (SLOT, other):
        await index.record_slot(MODEL, slot, old, 48)
        await client.hdel(slot_key(p, slot), "chain", "w")
        await client.hset(slot_key(p, slot), "blocks", json.dumps(old))
    await index.record_slot(MODEL, SLOT, new, 48)
    assert await members(client, p, old) == [True] * 4 + [False] * 2
    assert await members(client, p, new) == [True] * 6
    stored = await client.hgetall(slot_key(p))
    assert b"blocks" not in stored and stored[b"chain"] == "".join(new).encode()
    assert await index.purge_pod(other.pod_uid) == 1
    for h in old:
        assert await client.zscore(f"{p}:{{{MODEL}}}:b:{h}", other.key()) is None


async def test_lookup_finds_snapshot_ends_in_the_query_string_when_few(
    client: aioredis.Redis, rc: RespClient, p: str
) -> None:
    """With no snapshot in the model the lookup asks nothing about snapshots; with a few it searches
    the query for their last blocks; with many (one per eight query blocks or more) one SMISMEMBER
    asks for all. Every way finds what the in-memory index finds."""
    index, memory = RedisPrefixIndex(rc, prefix=p), InMemoryPrefixIndex()
    query = chain(text(40, "snaps"))
    for idx in (index, memory):
        await idx.record_slot(MODEL, SLOT, query[:30], 240)

    async def lookup_runs_smismember() -> int:
        before = await calls(client)
        assert await index.lookup(MODEL, query) == await memory.lookup(MODEL, query)
        return (await ran(client, before, "smismember"))[0]

    assert await lookup_runs_smismember() == 0
    for i, n_blocks in enumerate((20, 35, 40, 5, 12)):
        snap = SnapshotRef(f"s{i}", f"pod-{i}@1", n_blocks, n_blocks * 8, 1)
        for idx in (index, memory):
            await idx.record_snapshot(MODEL, snap, query[:n_blocks])
        assert await lookup_runs_smismember() == (1 if i + 1 >= 5 else 0), i
    found = await index.lookup(MODEL, query)
    assert sorted(s.n_blocks for s in found.snapshots) == [5, 12, 20, 35, 40]

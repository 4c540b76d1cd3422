"""Latency of one prefix-index lookup: a 240-block chain (60K characters) against 1,000 slot entries.

Runs a private real redis-server (`llamafleet_local.redis_server.RedisServer`) and prints p50/p99 of
`lookup` (one EVALSHA round trip) per workload shape, with the in-memory index beside it:

- agents:  200 of the 1,000 slots hold the same 200-block agent prefix plus their own tail; the rest
           hold unrelated chains; 50 snapshots of the prefix exist. The common shape.
- worst:   all 1,000 slots hold the query chain, with run lengths spread over 1..240 (every run length
           makes the Lua walk fetch a block's members once).
- cold:    1,000 unrelated slots; the query matches nothing (a never-seen prefix).

Usage: python bench/bench_index.py [--lookups 400]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from llamafleet_core.index import InMemoryPrefixIndex, PrefixIndex
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.types import SlotRef, SnapshotRef
from llamafleet_local.redis_server import RedisServer

BLOCK_CHARS = 250  # 240 blocks = 60K characters
MODEL = "bench-model"


def chain(seed: str, n_blocks: int, base: list[str] | None = None) -> list[str]:
    """Chained block hashes: `base` continued by `n_blocks` blocks derived from `seed`."""
    out = list(base or [])
    prev = out[-1].encode() if out else b""
    for i in range(n_blocks):
        block = hashlib.sha256(f"{seed}/{i}".encode()).hexdigest().encode() * (BLOCK_CHARS // 64 + 1)
        prev = hashlib.blake2b(prev + block[:BLOCK_CHARS], digest_size=8).hexdigest().encode()
        out.append(prev.decode())
    return out


async def fill(index: PrefixIndex, shape: str) -> list[str]:
    """Write 1,000 slot entries of the given shape; return the query chain (240 blocks)."""
    prefix = chain("agent-prefix", 200)
    query = chain("query-tail", 40, prefix)
    for i in range(1000):
        slot = SlotRef(f"pod-{i // 8}@1", i % 8)
        if shape == "agents" and i < 200:
            blocks = chain(f"tail-{i}", 30, prefix)
        elif shape == "worst":
            blocks = query[: 1 + (i * 239) // 999]
        else:
            blocks = chain(f"other-{i}", 60)
        await index.record_slot(MODEL, slot, blocks, len(blocks) * 60)
    if shape == "agents":
        for i in range(50):
            n = 100 + i * 2
            snap = SnapshotRef(f"snap-{i}", f"pod-{i}@1", n, n * 60, 1 << 24)
            await index.record_snapshot(MODEL, snap, prefix[:n])
    return query


async def timed(call: Callable[[], Awaitable[object]], n: int) -> tuple[float, float]:
    for _ in range(20):  # warm up: script load, connection, allocator
        await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(n - 1, int(n * 0.99))]


async def run(lookups: int) -> list[tuple[str, str, int, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        client = connect_index(server.url, timeout_s=5)
        try:
            for shape in ("agents", "worst", "cold"):
                await client.execute("FLUSHDB")
                backends: list[tuple[str, PrefixIndex]] = [
                    ("redis", RedisPrefixIndex(client)), ("memory", InMemoryPrefixIndex())]
                for name, index in backends:
                    query = await fill(index, shape)
                    found = await index.lookup(MODEL, query)
                    p50, p99 = await timed(partial(index.lookup, MODEL, query), lookups)
                    rows.append((shape, name, len(found.slots), p50, p99))
            await client.execute("FLUSHDB")
            redis_index = RedisPrefixIndex(client)
            blocks = chain("record", 240)
            record = partial(redis_index.record_slot, MODEL, SlotRef("p@1", 0), blocks, 1)
            p50, p99 = await timed(record, lookups)
            rows.append(("record_slot", "redis", 240, p50, p99))
        finally:
            await client.aclose()
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lookups", type=int, default=400)
    args = parser.parse_args()
    rows = asyncio.run(run(args.lookups))
    print(f"{'workload':<12} {'backend':<8} {'matched':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for shape, name, matched, p50, p99 in rows:
        print(f"{shape:<12} {name:<8} {matched:>8} {p50:>8.3f} {p99:>8.3f}")


if __name__ == "__main__":
    main()

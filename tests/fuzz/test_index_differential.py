"""The Redis index and the in-memory index agree under ANY sequence of operations (hypothesis stateful).

The contract suite checks chosen cases; this drives both implementations with the same random program
(record and forget slots and snapshots, purge pods, across two models and pods whose uids need URL
quoting) and compares every lookup and listing. Redis is real; each example runs in a fresh key prefix.
Leases too: acquire/release by several holders agree on who holds each slot.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.prefix import block_chain
from llamafleet_core.types import SlotRef, SnapshotRef

pytestmark = pytest.mark.redis

MODELS = ("m", "other/model")
NAMES = ["a", "b", "sp-x"]
PODS = ("http://10.0.0.1:8080", "http://[::1]:8080@1", "pod with space#2")
BASES = [" ".join(f"w{i}-{j}" for j in range(400)) for i in range(3)]
chains = st.builds(lambda base, cut, tail: tuple(block_chain(BASES[base][: cut * 64] + tail, seed="s",
                                                             block_chars=64)),
                   st.integers(0, 2), st.integers(1, 12), st.sampled_from(["", "x" * 70, "y" * 200]))
slots = st.builds(SlotRef, st.sampled_from(PODS), st.integers(0, 2))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_redis_and_memory_indexes_agree_under_any_program(redis_url: str,
                                                          loop: asyncio.AbstractEventLoop) -> None:
    client = connect_index(redis_url)
    counter = itertools.count()

    class Agree(RuleBasedStateMachine):
        @initialize()
        def fresh(self) -> None:
            prefix = f"fz{uuid.uuid4().hex[:8]}"
            self.redis = RedisPrefixIndex(client, prefix=prefix)
            self.mem = InMemoryPrefixIndex()
            self.rleases, self.mleases = RedisSlotLeases(client, prefix=prefix), InMemorySlotLeases()
            self.queries: list[tuple[str, tuple[str, ...]]] = []

        def both(self, op: str, *args: object) -> None:
            async def run() -> tuple[object, object]:
                return await getattr(self.redis, op)(*args), await getattr(self.mem, op)(*args)
            got, want = loop.run_until_complete(run())
            assert got == want, (op, args, got, want)

        @rule(model=st.sampled_from(MODELS), slot=slots, chain=chains, n=st.integers(0, 5000))
        def record_slot(self, model: str, slot: SlotRef, chain: tuple[str, ...], n: int) -> None:
            self.both("record_slot", model, slot, list(chain), n)
            self.queries.append((model, chain))

        @rule(model=st.sampled_from(MODELS), slot=slots)
        def forget_slot(self, model: str, slot: SlotRef) -> None:
            self.both("forget_slot", model, slot)

        @rule(model=st.sampled_from(MODELS), pod=st.sampled_from(PODS), chain=chains,
              name=st.sampled_from(NAMES))
        def record_snapshot(self, model: str, pod: str, chain: tuple[str, ...], name: str) -> None:
            snap = SnapshotRef(name=name, pod_uid=pod, n_blocks=0, n_tokens=len(chain) * 10,
                               size_bytes=next(counter), n_chars=len(chain) * 64, text_hash="h")
            self.both("record_snapshot", model, snap, list(chain))
            self.queries.append((model, chain))

        @rule(model=st.sampled_from(MODELS), pod=st.sampled_from(PODS), name=st.sampled_from(NAMES))
        def forget_snapshot(self, model: str, pod: str, name: str) -> None:
            self.both("forget_snapshot", model, name, pod)

        @rule(pod=st.sampled_from(PODS))
        def purge_pod(self, pod: str) -> None:
            self.both("purge_pod", pod)

        @rule(slot=slots, holder=st.sampled_from(["r1", "r2"]), take=st.booleans())
        def lease(self, slot: SlotRef, holder: str, take: bool) -> None:
            async def run() -> tuple[object, object]:
                if take:
                    return (await self.rleases.acquire(slot, holder, 30.0),
                            await self.mleases.acquire(slot, holder, 30.0))
                await self.rleases.release(slot, holder)
                await self.mleases.release(slot, holder)
                return await self.rleases.holder(slot), await self.mleases.holder(slot)
            got, want = loop.run_until_complete(run())
            assert got == want, (slot, holder, take, got, want)

        @invariant()
        def lookups_and_listings_agree(self) -> None:
            if not hasattr(self, "mem"):
                return
            for model, chain in self.queries[-6:]:
                self.both("lookup", model, list(chain))
            for model in MODELS:
                self.both("snapshots", model)

    try:
        run_state_machine_as_test(Agree, settings=settings(
            max_examples=25, stateful_step_count=20, deadline=None, database=None, derandomize=True,
            suppress_health_check=list(HealthCheck)))
    finally:
        loop.run_until_complete(client.aclose())

"""One contract for every PrefixIndex and SlotLeases: the in-memory ones and the Redis ones (real server).

Each test runs against both backends. The in-memory backend gets a fake clock, so "time passes" is
instant there; the Redis backend takes server time, so there the same step sleeps for real (TTLs in
these tests are a fraction of a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from llamafleet_core.index import (
    InMemoryPrefixIndex,
    InMemorySlotLeases,
    PrefixIndex,
    SlotLeases,
)
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.types import PromptTags, SlotRef, SnapshotRef, exact_text_hash

MODEL = "qwen2-tiny"


def chain(text: str, size: int = 8) -> list[str]:
    """Chained block hashes of `text`, like the router's: block i's hash covers blocks 0..i."""
    out: list[str] = []
    prev = b""
    for start in range(0, len(text) - size + 1, size):
        prev = hashlib.blake2b(prev + text[start : start + size].encode(), digest_size=8).hexdigest().encode()
        out.append(prev.decode())
    return out


def text(n_blocks: int, seed: str, size: int = 8) -> str:
    """Deterministic distinct text of exactly `n_blocks` blocks."""
    body = "".join(hashlib.sha256(f"{seed}/{i}".encode()).hexdigest() for i in range(n_blocks))
    return body[: n_blocks * size]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    name: str
    index: PrefixIndex
    leases: SlotLeases
    make_index: Callable[..., PrefixIndex]
    elapse: Callable[[float], Awaitable[None]]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("cluster", marks=pytest.mark.redis)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()

        async def advance(seconds: float) -> None:
            clock.now += seconds

        def make_memory(**kw: Any) -> PrefixIndex:
            return InMemoryPrefixIndex(clock=clock, **kw)

        yield Backend("memory", make_memory(), InMemorySlotLeases(clock=clock), make_memory, advance)
        return
    # "cluster": every contract also holds on a Redis Cluster (3 masters; hash tags keep each
    # operation on one shard, and the models' keys spread over the shards).
    url: str = (request.getfixturevalue("redis_cluster").url if request.param == "cluster"
                else request.getfixturevalue("redis_url"))
    client = connect_index(url)
    prefix = f"t-{uuid.uuid4().hex[:12]}"  # isolates this test's keys in the shared server

    def make_redis(**kw: Any) -> PrefixIndex:
        return RedisPrefixIndex(client, prefix=prefix, **kw)

    try:
        leases = RedisSlotLeases(client, prefix=prefix)
        yield Backend(request.param, make_redis(), leases, make_redis, asyncio.sleep)
    finally:
        await client.aclose()


SA, SB, SC, SD = SlotRef("pod-a@1", 0), SlotRef("pod-a@1", 1), SlotRef("pod-b@1", 0), SlotRef("pod-c@1", 3)


def conv(tag: str) -> PromptTags:
    return PromptTags(conversation=tag)


def snap(name: str, pod: str, blocks: Sequence[str]) -> SnapshotRef:
    n = len(blocks)
    return SnapshotRef(name=name, pod_uid=pod, n_blocks=n, n_tokens=10 * n, size_bytes=1 << 20)


class TestPrefixIndexContract:
    async def test_implements_protocol(self, backend: Backend) -> None:
        """Both backends satisfy the runtime-checkable protocols the router types against."""
        assert isinstance(backend.index, PrefixIndex)
        assert isinstance(backend.leases, SlotLeases)
        assert await backend.index.ping()

    async def test_longest_match_per_slot_when_slots_hold_different_lengths(self, backend: Backend) -> None:
        """Each slot maps to the number of leading query blocks it holds; non-holders are absent."""
        base = text(12, "base")
        full = chain(base)
        forked = chain(base[: 2 * 8] + text(6, "fork"))  # shares blocks 0..1 with `full`
        other = chain(text(5, "other"))
        idx = backend.index
        await idx.record_slot(MODEL, SA, full[:10], 80)
        await idx.record_slot(MODEL, SB, full[:4], 32)
        await idx.record_slot(MODEL, SC, forked, 64)
        await idx.record_slot(MODEL, SD, other, 40)

        found = await idx.lookup(MODEL, full[:8])
        assert found.slots == {SA: 8, SB: 4, SC: 2}
        assert found.best_slot_blocks() == 8
        assert (await idx.lookup(MODEL, full)).slots == {SA: 10, SB: 4, SC: 2}
        assert (await idx.lookup(MODEL, forked)).slots == {SA: 2, SB: 2, SC: 8}
        assert (await idx.lookup(MODEL, other[:1])).slots == {SD: 1}
        assert (await idx.lookup(MODEL, chain(text(3, "unseen")))).slots == {}
        assert (await idx.lookup(MODEL, [])).slots == {}

    async def test_record_slot_replaces_content_when_slot_is_recorded_again(self, backend: Backend) -> None:
        """Blocks a slot no longer holds stop matching it: shrinking and switching chains both count."""
        old = chain(text(10, "old"))
        new = chain(text(6, "new"))
        idx = backend.index
        await idx.record_slot(MODEL, SA, old, 80)
        await idx.record_slot(MODEL, SB, old, 80)
        await idx.record_slot(MODEL, SA, old[:3], 24)
        assert (await idx.lookup(MODEL, old)).slots == {SA: 3, SB: 10}
        await idx.record_slot(MODEL, SA, new, 48)
        assert (await idx.lookup(MODEL, old)).slots == {SB: 10}
        assert (await idx.lookup(MODEL, new)).slots == {SA: 6}
        await idx.forget_slot(MODEL, SA)
        assert (await idx.lookup(MODEL, new)).slots == {}
        await idx.record_slot(MODEL, SB, [], 0)  # an empty chain forgets too
        assert (await idx.lookup(MODEL, old)).slots == {}

    async def test_conversation_tag_names_the_slot_of_its_latest_record(self, backend: Backend) -> None:
        """A lookup with a tag gets the slot last recorded with it, while that slot keeps it: a record
        of the slot without the tag (a restore, another session) or a forget drops it, and a record of
        another slot with the tag moves it there. Whole blocks alone cannot tell these slots apart."""
        head = chain(text(6, "head"))
        idx = backend.index
        await idx.record_slot(MODEL, SA, head, 48, tags=conv("conv-x"))
        await idx.record_slot(MODEL, SB, head, 48, tags=conv("conv-y"))
        found = await idx.lookup(MODEL, head, tags=conv("conv-x"))
        assert found.slots == {SA: 6, SB: 6} and found.conversation == SA
        assert (await idx.lookup(MODEL, head, tags=conv("conv-y"))).conversation == SB
        assert (await idx.lookup(MODEL, head)).conversation is None
        assert (await idx.lookup(MODEL, head, tags=conv("conv-z"))).conversation is None
        await idx.record_slot(MODEL, SA, head, 48)  # overwritten without the tag: no longer its slot
        assert (await idx.lookup(MODEL, head, tags=conv("conv-x"))).conversation is None
        await idx.record_slot(MODEL, SC, head, 48, tags=conv("conv-y"))  # the conversation moved
        assert (await idx.lookup(MODEL, head, tags=conv("conv-y"))).conversation == SC
        await idx.record_slot(MODEL, SB, head[:2], 16)  # the old slot's re-record leaves the new one
        assert (await idx.lookup(MODEL, head, tags=conv("conv-y"))).conversation == SC
        assert (await idx.lookup(MODEL, chain(text(3, "other")), tags=conv("conv-y"))).conversation is None
        await idx.forget_slot(MODEL, SC)
        assert (await idx.lookup(MODEL, head, tags=conv("conv-y"))).conversation is None
        await idx.record_slot(MODEL, SD, head, 48, tags=conv("conv-w"))
        assert await idx.purge_pod(SD.pod_uid) == 1
        await idx.record_slot(MODEL, SD, head, 48)
        assert (await idx.lookup(MODEL, head, tags=conv("conv-w"))).conversation is None

    async def test_exact_head_names_the_slots_holding_the_head_where_its_blocks_end(
        self, backend: Backend
    ) -> None:
        """Slots whose run ends with the head's whole blocks hold it exactly, or part from it inside its
        last partial block (another day's date line): the head tag tells which. Slots matching past the
        head, or recorded without the tag, are not listed; a re-record without it drops the slot."""
        base = text(8, "head")
        query = chain(base + text(4, "q1"))
        other_question = chain(base + text(3, "q2"))
        other_day = chain(base[: 6 * 8] + text(5, "day2"))  # parts inside block 6, the head's last
        idx = backend.index
        today = PromptTags(head="h-today", head_blocks=6)
        tomorrow = PromptTags(head="h-tomorrow", head_blocks=6)
        await idx.record_slot(MODEL, SA, other_question[:6], 48, tags=today)
        await idx.record_slot(MODEL, SB, other_day, 88, tags=tomorrow)
        await idx.record_slot(MODEL, SC, query[:10], 80, tags=today)  # this head and past it
        await idx.record_slot(MODEL, SD, other_question[:6], 48)  # no tag
        found = await idx.lookup(MODEL, query, tags=today)
        assert found.slots == {SA: 6, SB: 6, SC: 10, SD: 6}
        assert found.exact_head == {SA}
        assert (await idx.lookup(MODEL, query, tags=tomorrow)).exact_head == {SB}
        assert (await idx.lookup(MODEL, query)).exact_head == frozenset()
        await idx.record_slot(MODEL, SA, other_question[:6], 48)
        assert (await idx.lookup(MODEL, query, tags=today)).exact_head == frozenset()
        await idx.record_slot(MODEL, SD, other_question[:6], 48, tags=today)
        await idx.forget_slot(MODEL, SD)
        assert (await idx.lookup(MODEL, query, tags=today)).exact_head == frozenset()

    async def test_models_never_mix_when_they_share_chains(self, backend: Backend) -> None:
        """The same blocks under another model (even one whose name extends this one's) match nothing."""
        blocks = chain(text(5, "shared"))
        idx = backend.index
        await idx.record_slot("m", SA, blocks, 40)
        await idx.record_snapshot("m", snap("s1", SA.pod_uid, blocks[:3]), blocks[:3])
        for other in ("m2", "m:b", "M", "m:"):
            found = await idx.lookup(other, blocks)
            assert found.slots == {} and found.snapshots == ()
            assert await idx.snapshots(other) == []
        await idx.record_slot("m:b", SB, blocks[:2], 16)
        assert (await idx.lookup("m", blocks)).slots == {SA: 5}
        assert (await idx.lookup("m:b", blocks)).slots == {SB: 2}

    async def test_snapshot_matches_when_its_blocks_are_a_prefix_of_the_chain(self, backend: Backend) -> None:
        """A snapshot of blocks 0..k-1 matches chains sharing those k blocks, longest first, and no
        chain that diverges before k or is shorter than k."""
        base = text(10, "snap")
        full = chain(base)
        idx = backend.index
        s5, s8 = snap("p5", "pod-a@1", full[:5]), snap("p8", "pod-b@1", full[:8])
        await idx.record_snapshot(MODEL, s5, full[:5])
        await idx.record_snapshot(MODEL, s8, full[:8])
        found = await idx.lookup(MODEL, full)
        assert [(s.name, s.n_blocks, s.last_block) for s in found.snapshots] == [
            ("p8", 8, full[7]), ("p5", 5, full[4])]
        assert found.slots == {}
        assert [s.name for s in (await idx.lookup(MODEL, full[:6])).snapshots] == ["p5"]
        assert (await idx.lookup(MODEL, full[:4])).snapshots == ()
        diverge_at_6 = chain(base[: 6 * 8] + text(4, "x"))
        assert [s.name for s in (await idx.lookup(MODEL, diverge_at_6)).snapshots] == ["p5"]
        diverge_at_3 = chain(base[: 3 * 8] + text(7, "y"))
        assert (await idx.lookup(MODEL, diverge_at_3)).snapshots == ()

    async def test_snapshot_keeps_its_exact_text_identity_when_stored(self, backend: Backend) -> None:
        """`n_chars` and `text_hash` (what a hybrid snapshot holds beyond its whole blocks) survive the
        index, so the router can check that a prompt extends the snapshot exactly."""
        prefix = text(5, "exact") + "<|im_start|>user"
        blocks = chain(prefix)
        ref = SnapshotRef("x", "pod-a@1", n_blocks=len(blocks), n_tokens=50, size_bytes=9,
                          n_chars=len(prefix), text_hash=exact_text_hash(prefix))
        await backend.index.record_snapshot(MODEL, ref, blocks)
        [found] = (await backend.index.lookup(MODEL, chain(prefix + "\nhello"))).snapshots
        assert (found.n_chars, found.text_hash) == (len(prefix), exact_text_hash(prefix))
        assert found.extended_by(prefix + "\nhello") and not found.extended_by(prefix[:-1] + "X\nhello")

    async def test_snapshots_list_and_forget_when_recorded_again(self, backend: Backend) -> None:
        """Recording a snapshot again replaces it (its old chain stops matching); forget removes it."""
        a, b = chain(text(6, "a")), chain(text(4, "b"))
        idx = backend.index
        await idx.record_snapshot(MODEL, snap("s", "pod-a@1", a), a)
        await idx.record_snapshot(MODEL, snap("t", "pod-b@1", b), b)
        await idx.record_snapshot(MODEL, snap("s", "pod-a@1", b[:2]), b[:2])
        listed = await idx.snapshots(MODEL)
        assert [(s.name, s.pod_uid, s.n_blocks, s.n_tokens, s.last_block) for s in listed] == [
            ("s", "pod-a@1", 2, 20, b[1]), ("t", "pod-b@1", 4, 40, b[3])]
        assert [s.name for s in await idx.snapshots(MODEL, pod_uid="pod-b@1")] == ["t"]
        assert (await idx.lookup(MODEL, a)).snapshots == ()
        assert [s.name for s in (await idx.lookup(MODEL, b)).snapshots] == ["t", "s"]
        await idx.forget_snapshot(MODEL, "t", "pod-b@1")
        await idx.forget_snapshot(MODEL, "t", "pod-a@1")  # another pod's "t": nothing to forget
        assert [s.name for s in await idx.snapshots(MODEL)] == ["s"]
        assert [s.name for s in (await idx.lookup(MODEL, b)).snapshots] == ["s"]

    async def test_record_snapshot_rejects_when_counts_disagree(self, backend: Backend) -> None:
        """A snapshot whose n_blocks or last_block contradicts its chain is a caller bug, not an entry."""
        blocks = chain(text(4, "bad"))
        ref = SnapshotRef("s", "pod-a@1", n_blocks=3, n_tokens=30, size_bytes=1)
        with pytest.raises(ValueError):
            await backend.index.record_snapshot(MODEL, ref, blocks)
        with pytest.raises(ValueError):
            await backend.index.record_snapshot(MODEL, ref, [])
        auto = SnapshotRef("s", "pod-a@1", n_blocks=0, n_tokens=30, size_bytes=1)
        await backend.index.record_snapshot(MODEL, auto, blocks)
        assert [(s.n_blocks, s.last_block) for s in await backend.index.snapshots(MODEL)] == [(4, blocks[3])]

    async def test_purge_pod_removes_exactly_its_entries(self, backend: Backend) -> None:
        """Purging one pod removes its slots and snapshots in every model and nothing of other pods."""
        blocks = chain(text(6, "purge"))
        idx = backend.index
        await idx.record_slot(MODEL, SA, blocks, 48)
        await idx.record_slot(MODEL, SB, blocks[:3], 24)
        await idx.record_slot("other-model", SA, blocks, 48)
        await idx.record_snapshot(MODEL, snap("s", "pod-a@1", blocks[:2]), blocks[:2])
        await idx.record_slot(MODEL, SC, blocks, 48)
        await idx.record_snapshot(MODEL, snap("s", "pod-b@1", blocks[:2]), blocks[:2])

        assert await idx.purge_pod("pod-a@1") == 4
        found = await idx.lookup(MODEL, blocks)
        assert found.slots == {SC: 6}
        assert [(s.name, s.pod_uid) for s in found.snapshots] == [("s", "pod-b@1")]
        assert (await idx.lookup("other-model", blocks)).slots == {}
        assert await idx.purge_pod("pod-a@1") == 0
        await idx.record_slot(MODEL, SA, blocks[:1], 8)  # the pod uid can record again afterwards
        assert (await idx.lookup(MODEL, blocks)).slots == {SA: 1, SC: 6}

    async def test_entries_expire_when_ttl_passes_without_refresh(self, backend: Backend) -> None:
        """Slot and snapshot entries stop matching after their TTL; recording again refreshes them."""
        idx = backend.make_index(slot_ttl_s=1.0, snapshot_ttl_s=1.0)
        blocks = chain(text(4, "ttl"))
        await idx.record_slot(MODEL, SA, blocks, 32)
        await idx.record_slot(MODEL, SB, blocks, 32)
        await idx.record_snapshot(MODEL, snap("s", "pod-a@1", blocks), blocks)
        await backend.elapse(0.6)
        await idx.record_slot(MODEL, SB, blocks, 32)  # refreshed: lives 1 s from now
        assert (await idx.lookup(MODEL, blocks)).slots == {SA: 4, SB: 4}
        await backend.elapse(0.6)
        found = await idx.lookup(MODEL, blocks)
        assert found.slots == {SB: 4}
        assert found.snapshots == ()
        assert await idx.snapshots(MODEL) == []
        assert await idx.purge_pod("pod-a@1") == 1  # only SB is still live
        await backend.elapse(0.6)
        assert (await idx.lookup(MODEL, blocks)).slots == {}


    async def test_slot_stays_whole_when_rerecorded_soon_then_refreshed_later(self, backend: Backend) -> None:
        """A re-record soon after the last one may add only the new blocks (Redis), but a later refresh
        renews every block: no block of a refreshed slot expires under it."""
        idx = backend.make_index(slot_ttl_s=1.0)
        head = text(4, "soon")
        grown = chain(head + text(2, "tail"))
        await idx.record_slot(MODEL, SA, chain(head), 32)
        await backend.elapse(0.02)
        await idx.record_slot(MODEL, SA, grown, 48)  # within the first tenth of the TTL
        assert (await idx.lookup(MODEL, grown)).slots == {SA: 6}
        await backend.elapse(0.3)
        await idx.record_slot(MODEL, SA, grown, 48)  # past the first tenth: every block refreshed
        await backend.elapse(0.8)  # past the first record's deadline, before the last one's
        assert (await idx.lookup(MODEL, grown)).slots == {SA: 6}


class TestSlotLeasesContract:
    async def test_lease_is_exclusive_and_only_the_holder_releases(self, backend: Backend) -> None:
        """One holder at a time; a stranger's release is a no-op; the holder may refresh."""
        leases = backend.leases
        assert await leases.holder(SA) is None
        assert await leases.acquire(SA, "router-1", 30)
        assert not await leases.acquire(SA, "router-2", 30)
        assert await leases.acquire(SB, "router-2", 30)  # another slot is independent
        assert await leases.acquire(SA, "router-1", 30)  # re-entrant refresh
        await leases.release(SA, "router-2")
        assert await leases.holder(SA) == "router-1"
        await leases.release(SA, "router-1")
        assert await leases.holder(SA) is None
        assert await leases.acquire(SA, "router-2", 30)
        assert await leases.holder(SA) == "router-2"

    async def test_lease_expires_when_ttl_passes(self, backend: Backend) -> None:
        """A crashed holder's lease frees itself; its late release cannot free the next holder's."""
        leases = backend.leases
        assert await leases.acquire(SA, "router-1", 0.3)
        await backend.elapse(0.45)
        assert await leases.holder(SA) is None
        assert await leases.acquire(SA, "router-2", 30)
        await leases.release(SA, "router-1")
        assert await leases.holder(SA) == "router-2"

    async def test_exactly_one_wins_when_50_acquire_concurrently(self, backend: Backend) -> None:
        """50 concurrent attempts on one slot: exactly one True, and it is the recorded holder."""
        leases = backend.leases
        results = await asyncio.gather(*(leases.acquire(SC, f"r{i}", 30) for i in range(50)))
        winners = [i for i, ok in enumerate(results) if ok]
        assert len(winners) == 1
        assert await leases.holder(SC) == f"r{winners[0]}"

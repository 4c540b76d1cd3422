"""The prefix index contract: what every implementation (Redis, in-memory) promises.

The index is a HINT. The router intersects every answer with the live endpoints, and the server's own
`cache_n` is the truth, so a stale or lost entry costs a slower request, never a wrong one. That is why
entries simply expire (TTL) instead of being kept consistent by a coordinator.

Block chains: a prompt is cut into fixed-size character blocks whose hashes are chained (block i's hash
covers blocks 0..i). Implementations may rely on that: a slot that holds block i of a chain holds blocks
0..i of it too, so "how many leading blocks does this slot hold" is the position of the last block of the
query chain it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from llamafleet_core.types import (
    DivergencePoint,
    HeadFamily,
    HeadRecord,
    Lookup,
    PromptTags,
    SlotRef,
    SnapshotRef,
)

DEFAULT_SLOT_TTL_S = 3600.0  # a slot's content is overwritten within minutes when busy; an hour covers idle
# A week: a snapshot serves the next working day's first session (yesterday's head, 24 h and a few
# minutes later) and the day after; the agents' byte budget, not this, decides what stays on disk.
DEFAULT_SNAPSHOT_TTL_S = 7 * 86400.0
FAMILY_HEADS = 8  # heads kept per family, newest first
FAMILY_POINTS = 16  # divergence points kept per family, newest first
DEFAULT_PREFIX = "lf"


class IndexUnavailable(RuntimeError):
    """The index backend cannot answer (Redis down, timed out, or failed a command).

    The ONLY exception the Redis implementations raise for backend trouble, so the router can catch it
    in one place and switch to degraded routing (consistent hashing with bounded load).
    """


@runtime_checkable
class PrefixIndex(Protocol):
    """Which (pod, slot) holds how much of a block chain, and which snapshots hold a prefix of it."""

    async def lookup(self, model: str, blocks: Sequence[str], tags: PromptTags | None = None) -> Lookup:
        """Longest match, per (pod, slot) and per snapshot, of the chain `blocks` for `model`.

        `Lookup.slots[slot]` is how many leading blocks of `blocks` the slot holds (only slots holding
        at least block 0 appear). `Lookup.snapshots` lists the snapshots whose chain is a prefix of
        `blocks` (their matched block count is their `n_blocks`), longest first. With `tags`:
        `Lookup.conversation` is the slot last recorded with `tags.conversation`, if no other record
        replaced it since and it holds some of `blocks`; `Lookup.exact_head` the slots holding exactly
        `tags.head_blocks` blocks whose latest record had `tags.head`. One backend round trip.
        """
        ...

    async def record_slot(
        self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int, tags: PromptTags | None = None
    ) -> None:
        """The slot holds `blocks` NOW: replaces what it held before (old blocks stop matching it).

        `tags` (`PromptIdentity.tags`) say which head and which conversation the slot holds exactly:
        whole blocks cannot tell a slot holding this head, or this conversation's last turn, from one
        whose text parts from it inside the last block, and the decision needs to know (a model that
        resumes only at checkpoints, a head differing in its date line). A record without them (a
        restore, a build) clears the slot's tags. An empty `blocks` is the same as `forget_slot`.
        Refreshes the entry's TTL.
        """
        ...

    async def forget_slot(self, model: str, slot: SlotRef) -> None:
        """The slot holds nothing we know of (erased, or the server's `cache_n` disagreed)."""
        ...

    async def record_snapshot(self, model: str, snap: SnapshotRef, blocks: Sequence[str]) -> None:
        """Snapshot `snap` (identified by name and pod uid) holds exactly the chain `blocks`.

        `snap.n_blocks` must equal `len(blocks)` or be 0 (then it is taken from `blocks`); `last_block`
        is filled from `blocks`. Recording again replaces the entry and refreshes its TTL.
        """
        ...

    async def forget_snapshot(self, model: str, name: str, pod_uid: str) -> None:
        """The snapshot file is gone (evicted by the byte budget, or failed verification)."""
        ...

    async def snapshots(self, model: str, pod_uid: str | None = None) -> list[SnapshotRef]:
        """Live snapshots of `model` (of one pod if `pod_uid`), sorted by (name, pod_uid)."""
        ...

    async def purge_pod(self, pod_uid: str) -> int:
        """Remove every slot and snapshot entry of the pod, in all models; returns how many there were.

        Costs O(the pod's entries), not O(the index): a pod that is gone must not be a scan of Redis.
        """
        ...

    async def record_head(
        self, model: str, family: str, head: HeadRecord, points: Sequence[DivergencePoint] = (),
    ) -> None:
        """The fleet built `head` of `family` (its first block's hash), and learned `points` where heads
        of the family part. Both go first in their lists (a head or point seen again moves up); the
        lists keep `FAMILY_HEADS` heads and `FAMILY_POINTS` points; the family lives as long as a
        snapshot. Off the request path: called once per head built."""
        ...

    async def family(self, model: str, family: str) -> HeadFamily:
        """The heads and divergence points recorded for `family`, newest first (empty when unknown)."""
        ...

    async def ping(self) -> bool:
        """True when the backend answers; never raises."""
        ...

    async def instance(self) -> str:
        """An identity of the backend's present life, the same from every caller: it changes when the
        backend lost its entries (a Redis without persistence restarted, or was flushed), so that whoever
        can record some again (the agents' snapshots) does, even when no ping fell in the outage."""
        ...

    async def close(self) -> None:
        """Release what the index owns (not an injected client)."""
        ...


@runtime_checkable
class SlotLeases(Protocol):
    """Short exclusive leases on slots, so two router replicas never pin the same slot at once."""

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float) -> bool:
        """Atomically take the slot's lease for `ttl_s` seconds; True if `holder` now holds it.

        Only one holder at a time. The current holder acquiring again refreshes its lease (True).
        """
        ...

    async def release(self, slot: SlotRef, holder: str) -> None:
        """Give the lease back; a no-op unless `holder` holds it (an expired lease may be someone else's)."""
        ...

    async def holder(self, slot: SlotRef) -> str | None:
        """Who holds the slot's lease now, if anyone."""
        ...


def check_snapshot(snap: SnapshotRef, blocks: Sequence[str]) -> SnapshotRef:
    """Normalize a snapshot against its chain: pure, shared by both implementations so they agree."""
    if not blocks:
        raise ValueError("a snapshot must cover at least one block")
    if snap.n_blocks not in (0, len(blocks)):
        raise ValueError(f"snapshot {snap.name!r}: n_blocks={snap.n_blocks} but {len(blocks)} blocks given")
    if snap.last_block not in ("", blocks[-1]):
        raise ValueError(f"snapshot {snap.name!r}: last_block is not the last of the given blocks")
    return replace(snap, n_blocks=len(blocks), last_block=blocks[-1])


def snapshot_order(snap: SnapshotRef) -> tuple[int, str, str]:
    """Lookup order: longest first, then by name and pod, so both implementations answer identically."""
    return (-snap.n_blocks, snap.name, snap.pod_uid)


def merge_family(
    old: HeadFamily, head: HeadRecord, points: Sequence[DivergencePoint],
    *, max_heads: int = FAMILY_HEADS, max_points: int = FAMILY_POINTS,
) -> HeadFamily:
    """`old` with `head` and `points` put first (newest first, no duplicates), cut to the bounds: pure,
    the in-memory index's `record_head` and the contract the Redis script keeps."""
    new_points = tuple(dict.fromkeys(points))
    return HeadFamily(
        heads=(head, *(h for h in old.heads if h != head))[:max_heads],
        points=(*new_points, *(p for p in old.points if p not in new_points))[:max_points],
    )

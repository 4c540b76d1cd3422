"""In-process prefix index and slot leases with the same contract as the Redis ones.

For tests, single-replica development and the router's degraded mode. Time comes from an injectable
clock so TTL behaviour is testable without sleeping. Every method runs without an `await` inside, so
on one event loop each call is atomic, like a Lua script in Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamafleet_core.index.base import (
    DEFAULT_SLOT_TTL_S,
    DEFAULT_SNAPSHOT_TTL_S,
    check_snapshot,
    snapshot_order,
)
from llamafleet_core.types import Lookup, SlotRef, SnapshotRef

Clock = Callable[[], float]

_SnapKey = tuple[str, str]  # (name, pod_uid)


@dataclass(frozen=True, slots=True)
class _SlotEntry:
    blocks: tuple[str, ...]
    n_tokens: int
    deadline: float


def _common_prefix(held: tuple[str, ...], query: Sequence[str]) -> int:
    n = 0
    for a, b in zip(held, query, strict=False):
        if a != b:
            break
        n += 1
    return n


def _covers(chain: Sequence[str], snap: SnapshotRef) -> bool:
    """The snapshot's chain is a prefix of `chain`: chained hashes make its last block decide it."""
    return snap.n_blocks <= len(chain) and chain[snap.n_blocks - 1] == snap.last_block


class InMemoryPrefixIndex:
    """Dicts keyed by model; see `PrefixIndex` for the contract."""

    def __init__(
        self,
        *,
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        snapshot_ttl_s: float = DEFAULT_SNAPSHOT_TTL_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self.slot_ttl_s = slot_ttl_s
        self.snapshot_ttl_s = snapshot_ttl_s
        self._clock = clock
        self._slots: dict[str, dict[SlotRef, _SlotEntry]] = {}
        self._snaps: dict[str, dict[_SnapKey, tuple[SnapshotRef, float]]] = {}
        # Per pod, what it has in which model, so purge_pod costs O(its entries).
        self._pod_slots: dict[str, set[tuple[str, SlotRef]]] = {}
        self._pod_snaps: dict[str, set[tuple[str, _SnapKey]]] = {}

    async def lookup(self, model: str, blocks: Sequence[str]) -> Lookup:
        now = self._clock()
        slots: dict[SlotRef, int] = {}
        if blocks:
            for ref, entry in self._slots.get(model, {}).items():
                if entry.deadline > now:
                    n = _common_prefix(entry.blocks, blocks)
                    if n:
                        slots[ref] = n
        snaps = [
            snap
            for snap, deadline in self._snaps.get(model, {}).values()
            if deadline > now and _covers(blocks, snap)
        ]
        return Lookup(slots=slots, snapshots=tuple(sorted(snaps, key=snapshot_order)))

    async def record_slot(self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int) -> None:
        if not blocks:
            await self.forget_slot(model, slot)
            return
        deadline = self._clock() + self.slot_ttl_s
        self._slots.setdefault(model, {})[slot] = _SlotEntry(tuple(blocks), n_tokens, deadline)
        self._pod_slots.setdefault(slot.pod_uid, set()).add((model, slot))

    async def forget_slot(self, model: str, slot: SlotRef) -> None:
        self._slots.get(model, {}).pop(slot, None)
        self._pod_slots.get(slot.pod_uid, set()).discard((model, slot))

    async def record_snapshot(self, model: str, snap: SnapshotRef, blocks: Sequence[str]) -> None:
        snap = check_snapshot(snap, blocks)
        key = (snap.name, snap.pod_uid)
        self._snaps.setdefault(model, {})[key] = (snap, self._clock() + self.snapshot_ttl_s)
        self._pod_snaps.setdefault(snap.pod_uid, set()).add((model, key))

    async def forget_snapshot(self, model: str, name: str, pod_uid: str) -> None:
        self._snaps.get(model, {}).pop((name, pod_uid), None)
        self._pod_snaps.get(pod_uid, set()).discard((model, (name, pod_uid)))

    async def snapshots(self, model: str, pod_uid: str | None = None) -> list[SnapshotRef]:
        now = self._clock()
        found = [
            snap
            for snap, deadline in self._snaps.get(model, {}).values()
            if deadline > now and (pod_uid is None or snap.pod_uid == pod_uid)
        ]
        return sorted(found, key=lambda s: (s.name, s.pod_uid))

    async def purge_pod(self, pod_uid: str) -> int:
        now = self._clock()
        removed = 0
        for model, slot in self._pod_slots.pop(pod_uid, set()):
            entry = self._slots.get(model, {}).pop(slot, None)
            if entry is not None and entry.deadline > now:
                removed += 1
        for model, key in self._pod_snaps.pop(pod_uid, set()):
            found = self._snaps.get(model, {}).pop(key, None)
            if found is not None and found[1] > now:
                removed += 1
        return removed

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class InMemorySlotLeases:
    """Slot leases in a dict; see `SlotLeases` for the contract."""

    def __init__(self, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._leases: dict[SlotRef, tuple[str, float]] = {}

    def _current(self, slot: SlotRef) -> str | None:
        lease = self._leases.get(slot)
        if lease is None:
            return None
        if lease[1] <= self._clock():
            del self._leases[slot]
            return None
        return lease[0]

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float) -> bool:
        current = self._current(slot)
        if current not in (None, holder):
            return False
        self._leases[slot] = (holder, self._clock() + ttl_s)
        return True

    async def release(self, slot: SlotRef, holder: str) -> None:
        if self._current(slot) == holder:
            del self._leases[slot]

    async def holder(self, slot: SlotRef) -> str | None:
        return self._current(slot)

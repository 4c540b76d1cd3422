"""In-process prefix index with the same contract as the Redis one (its leases: `memory_leases`).

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
    merge_family,
    snapshot_order,
)
from llamafleet_core.types import (
    DivergencePoint,
    HeadFamily,
    HeadRecord,
    Lookup,
    PromptTags,
    SlotRef,
    SnapshotRef,
)

Clock = Callable[[], float]

_SnapKey = tuple[str, str]  # (name, pod_uid)
_MAX_REFS = 65_536
_MAX_FAMILIES = 4_096  # past this, expired families are dropped (each holds at most a few heads' chains)


@dataclass(frozen=True, slots=True)
class _SlotEntry:
    blocks: tuple[str, ...]
    n_tokens: int
    deadline: float
    tags: PromptTags | None = None


def _runs(holders: dict[str, set[SlotRef]], query: Sequence[str]) -> dict[SlotRef, int]:
    """How many leading blocks of `query` each slot holds, from the block -> slots map.

    Chained hashes make the sets nested: a slot holding block i holds blocks 0..i, so c(i), the size of
    block i's set, never grows with i, and a slot's run ends where it leaves the sets. The drop points
    of c are found by bisection (O(D log n) set sizes for D distinct run ends) and the slots leaving at
    each one by a set difference, the same plan as the Redis script. Walking every block would cost
    n set operations; comparing every entry's chain would cost the whole index.
    """
    n = len(query)
    empty: set[SlotRef] = set()

    def at(i: int) -> set[SlotRef]:
        return holders.get(query[i], empty)

    c0 = len(at(0))
    if c0 == 0:
        return {}
    drops: list[int] = []
    stack = [(0, c0, n - 1, len(at(n - 1)))]
    while stack:
        a, ca, b, cb = stack.pop()
        if ca == cb:
            continue
        if b == a + 1:
            drops.append(a)
            continue
        mid = (a + b) // 2
        cm = len(at(mid))
        stack.append((a, ca, mid, cm))
        stack.append((mid, cm, b, cb))
    out: dict[SlotRef, int] = {}
    for a in drops:
        for ref in at(a) - at(a + 1):
            out[ref] = a + 1
    for ref in at(n - 1):
        out[ref] = n
    return out


class InMemoryPrefixIndex:
    """Dicts keyed by model, laid out like the Redis keys; see `PrefixIndex` for the contract.

    Per model: slot -> entry, block hash -> slots holding it, and the snapshots by the block they end
    at, so a lookup walks the query chain, never the whole index (1,000 entries took ~7 ms to scan).
    """

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
        self._holders: dict[str, dict[str, set[SlotRef]]] = {}
        self._snaps: dict[str, dict[_SnapKey, tuple[SnapshotRef, float]]] = {}
        self._snap_last: dict[str, dict[str, set[_SnapKey]]] = {}
        self._convs: dict[str, dict[str, SlotRef]] = {}  # model -> conversation tag -> its latest slot
        self._heads: dict[str, dict[str, set[SlotRef]]] = {}  # model -> head tag -> slots holding it
        self._refs: dict[SlotRef, SlotRef] = {}  # canonical SlotRef objects (bounded by the fleet's slots)
        # Per pod, what it has in which model, so purge_pod costs O(its entries).
        self._pod_slots: dict[str, set[tuple[str, SlotRef]]] = {}
        self._pod_snaps: dict[str, set[tuple[str, _SnapKey]]] = {}
        self._families: dict[tuple[str, str], tuple[HeadFamily, float]] = {}  # (model, family) -> deadline

    async def lookup(self, model: str, blocks: Sequence[str], tags: PromptTags | None = None) -> Lookup:
        if not blocks:
            return Lookup()
        now = self._clock()
        entries = self._slots.get(model, {})
        slots = _runs(self._holders.get(model, {}), blocks)
        expired = [ref for ref in slots if entries[ref].deadline <= now]
        for ref in expired:  # drop them now, as Redis would have
            del slots[ref]
            self._drop_slot(model, ref)
        snaps: list[SnapshotRef] = []
        by_last = self._snap_last.get(model)
        if by_last:
            catalog = self._snaps[model]
            for i, block in enumerate(blocks):
                for key in by_last.get(block, ()):
                    snap, deadline = catalog[key]
                    if deadline > now and snap.n_blocks == i + 1:
                        snaps.append(snap)
        if tags is None:
            return Lookup(slots=slots, snapshots=tuple(sorted(snaps, key=snapshot_order)))
        own = self._convs.get(model, {}).get(tags.conversation) if tags.conversation else None
        if own is not None and own not in slots:  # it holds none of this chain: not this conversation
            own = None
        held = self._heads.get(model, {}).get(tags.head) if tags.head else None
        exact = frozenset(ref for ref in held if slots.get(ref) == tags.head_blocks) if held else frozenset()
        return Lookup(slots=slots, snapshots=tuple(sorted(snaps, key=snapshot_order)), conversation=own,
                      exact_head=exact)

    async def record_slot(
        self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int, tags: PromptTags | None = None
    ) -> None:
        if not blocks:
            await self.forget_slot(model, slot)
            return
        chain = tuple(blocks)
        holders = self._holders.setdefault(model, {})
        if len(self._refs) > _MAX_REFS:  # only an optimisation: equal objects still work after this
            self._refs.clear()
        slot = self._refs.setdefault(slot, slot)  # one object per slot: set operations hit identity
        old = self._slots.get(model, {}).get(slot)
        # Only the difference touches the block sets: a session's next turn re-records the same
        # prefix plus a new tail, so most of its 240 blocks are already there.
        held = set(old.blocks) if old is not None else set()
        if old is not None:
            keep = set(chain)
            for h in old.blocks:
                if h not in keep:
                    _discard(holders, h, slot)
        for h in chain:
            if h in held:
                continue
            found = holders.get(h)
            if found is None:
                holders[h] = {slot}
            else:
                found.add(slot)
        deadline = self._clock() + self.slot_ttl_s
        if old is not None:
            self._untag(model, slot, old)
        self._slots.setdefault(model, {})[slot] = _SlotEntry(chain, n_tokens, deadline, tags)
        if tags is not None and tags.conversation:
            self._convs.setdefault(model, {})[tags.conversation] = slot
        if tags is not None and tags.head:
            self._heads.setdefault(model, {}).setdefault(tags.head, set()).add(slot)
        self._pod_slots.setdefault(slot.pod_uid, set()).add((model, slot))

    def _untag(self, model: str, slot: SlotRef, entry: _SlotEntry) -> None:
        """The slot no longer holds `entry`'s head and conversation (a conversation's tag stays with the
        slot that took it since)."""
        tags = entry.tags
        if tags is None:
            return
        convs = self._convs.get(model)
        if tags.conversation and convs is not None and convs.get(tags.conversation) == slot:
            del convs[tags.conversation]
        holders = self._heads.get(model, {}).get(tags.head) if tags.head else None
        if holders is not None and tags.head:
            holders.discard(slot)
            if not holders:
                del self._heads[model][tags.head]

    def _drop_slot(self, model: str, slot: SlotRef) -> _SlotEntry | None:
        entry = self._slots.get(model, {}).pop(slot, None)
        if entry is not None:
            self._untag(model, slot, entry)
            holders = self._holders.get(model, {})
            for h in entry.blocks:
                _discard(holders, h, slot)
        self._pod_slots.get(slot.pod_uid, set()).discard((model, slot))
        return entry

    async def forget_slot(self, model: str, slot: SlotRef) -> None:
        self._drop_slot(model, slot)

    async def record_snapshot(self, model: str, snap: SnapshotRef, blocks: Sequence[str]) -> None:
        snap = check_snapshot(snap, blocks)
        key = (snap.name, snap.pod_uid)
        self._drop_snapshot(model, key)
        self._snaps.setdefault(model, {})[key] = (snap, self._clock() + self.snapshot_ttl_s)
        self._snap_last.setdefault(model, {}).setdefault(snap.last_block, set()).add(key)
        self._pod_snaps.setdefault(snap.pod_uid, set()).add((model, key))

    def _drop_snapshot(self, model: str, key: _SnapKey) -> tuple[SnapshotRef, float] | None:
        found = self._snaps.get(model, {}).pop(key, None)
        if found is not None:
            by_last = self._snap_last.get(model, {})
            keys = by_last.get(found[0].last_block)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del by_last[found[0].last_block]
        self._pod_snaps.get(key[1], set()).discard((model, key))
        return found

    async def forget_snapshot(self, model: str, name: str, pod_uid: str) -> None:
        self._drop_snapshot(model, (name, pod_uid))

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
        for model, slot in list(self._pod_slots.get(pod_uid, ())):
            entry = self._drop_slot(model, slot)
            if entry is not None and entry.deadline > now:
                removed += 1
        for model, key in list(self._pod_snaps.get(pod_uid, ())):
            found = self._drop_snapshot(model, key)
            if found is not None and found[1] > now:
                removed += 1
        self._pod_slots.pop(pod_uid, None)
        self._pod_snaps.pop(pod_uid, None)
        return removed

    async def record_head(
        self, model: str, family: str, head: HeadRecord, points: Sequence[DivergencePoint] = (),
    ) -> None:
        now = self._clock()
        if len(self._families) >= _MAX_FAMILIES:
            self._families = {k: v for k, v in self._families.items() if v[1] > now}
        merged = merge_family(await self.family(model, family), head, points)
        self._families[(model, family)] = (merged, now + self.snapshot_ttl_s)

    async def family(self, model: str, family: str) -> HeadFamily:
        found = self._families.get((model, family))
        if found is None or found[1] <= self._clock():
            return HeadFamily()
        return found[0]

    async def ping(self) -> bool:
        return True

    async def instance(self) -> str:
        return f"memory-{id(self):x}"  # its entries live exactly as long as this object

    async def close(self) -> None:
        return None


def _discard(holders: dict[str, set[SlotRef]], block: str, slot: SlotRef) -> None:
    found = holders.get(block)
    if found is not None:
        found.discard(slot)
        if not found:
            del holders[block]

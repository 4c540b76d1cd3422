"""Slot leases held per router replica, on behalf of that replica's requests.

Leases exist so that two router replicas never pin the same slot at once. In Redis the lease is held
under the *replica's* name; locally this wrapper remembers which request holds it. That split fixes a
race an agent hits on every turn: its next request arrives as soon as the previous answer ends, often
before that answer's lease release has reached Redis. The finishing request gives the slot up locally
and synchronously (`relinquish`), so the next request of the same replica can take it at once (the
Redis lease is still ours: acquiring it again only refreshes it), and the late release then sees the
slot in use again and leaves the Redis lease in place.

Two requests of one replica never share a slot: `acquire` refuses while a local holder exists.
"""

from __future__ import annotations

import asyncio

from llamafleet_core.index.base import SlotLeases
from llamafleet_core.types import SlotRef


class ReplicaLeases:
    """A `SlotLeases` over another one, with every Redis lease held under this replica's name."""

    def __init__(self, inner: SlotLeases, replica: str) -> None:
        self._inner = inner
        self.replica = replica
        self._holders: dict[SlotRef, str] = {}
        self._locks: dict[SlotRef, asyncio.Lock] = {}

    def _lock(self, slot: SlotRef) -> asyncio.Lock:
        lock = self._locks.get(slot)
        if lock is None:
            lock = self._locks[slot] = asyncio.Lock()
        return lock

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float) -> bool:
        if slot in self._holders:
            return False
        self._holders[slot] = holder  # reserved before awaiting: a concurrent request sees it
        try:
            async with self._lock(slot):
                ok = await self._inner.acquire(slot, self.replica, ttl_s)
        except BaseException:
            self._holders.pop(slot, None)
            raise
        if not ok:
            self._holders.pop(slot, None)
        return ok

    def relinquish(self, slot: SlotRef, holder: str) -> None:
        """The request is done with the slot (synchronous; the Redis lease goes in `release`)."""
        if self._holders.get(slot) == holder:
            del self._holders[slot]

    async def release(self, slot: SlotRef, holder: str) -> None:
        self.relinquish(slot, holder)
        async with self._lock(slot):
            if slot in self._holders:
                return  # another request of this replica took the slot meanwhile: keep the lease
            await self._inner.release(slot, self.replica)

    async def holder(self, slot: SlotRef) -> str | None:
        return await self._inner.holder(slot)

    def held(self) -> int:
        """Slots a request of this replica holds now (tests check for leaks)."""
        return len(self._holders)

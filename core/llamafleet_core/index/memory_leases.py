"""In-process slot leases with the same contract as the Redis ones.

Apart from the in-memory index because the two share nothing but the clock: a lease is a holder and a
deadline per slot, checked lazily, with no await inside a method (atomic on one event loop).
"""

from __future__ import annotations

import time

from llamafleet_core.index.memory import Clock
from llamafleet_core.types import SlotRef


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

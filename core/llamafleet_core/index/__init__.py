"""The shared prefix index (which pod and slot hold which prompt prefix) and slot leases.

`base` holds the contract (`PrefixIndex`, `SlotLeases`, `IndexUnavailable`); `memory` and
`memory_leases`, `redis_index` and `redis_leases` (on the clients of `redis_conn`) implement it
identically. The Redis modules are not imported here, so code that only needs the contract or the
in-memory index does not pay for the redis client import.
"""

from llamafleet_core.index.base import IndexUnavailable, PrefixIndex, SlotLeases
from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases

__all__ = ["InMemoryPrefixIndex", "InMemorySlotLeases", "IndexUnavailable", "PrefixIndex", "SlotLeases"]

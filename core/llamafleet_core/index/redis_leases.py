"""Slot leases in Redis (`P:lease:{slotkey}`, in the key schema of `redis_index`).

Apart from the index because a lease shares none of its keys or scripts: one key per slot, taken
with SET NX PX (its holder refreshes it) and given back by compare-and-delete, since an expired lease
may already be someone else's.
"""

from __future__ import annotations

from urllib.parse import quote

from llamafleet_core.index.base import DEFAULT_PREFIX
from llamafleet_core.index.redis_conn import DEFAULT_OP_TIMEOUT_S, RedisBase, decoded, ms
from llamafleet_core.index.resp import IndexClient, LuaScript
from llamafleet_core.types import SlotRef

# KEYS: lease key; ARGV: holder, ttl ms -> 1 if the holder now holds it. The current holder refreshes.
_ACQUIRE_LEASE = LuaScript("""
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]); return 1 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
""")

# KEYS: lease key; ARGV: holder. Compare-and-delete: an expired lease may already be someone else's.
_RELEASE_LEASE = LuaScript("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


class RedisSlotLeases(RedisBase):
    """`SlotLeases` over Redis: SET NX PX to take, Lua compare-and-delete to give back."""

    def __init__(
        self,
        client: IndexClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
    ) -> None:
        super().__init__(client, prefix, op_timeout_s)

    def _key(self, slot: SlotRef) -> str:
        return f"{self._prefix}:lease:{quote(slot.key(), safe='')}"

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float) -> bool:
        got = await self._call(
            lambda: self._client.run_script(_ACQUIRE_LEASE, [self._key(slot)], [holder, ms(ttl_s)]))
        return bool(int(got))

    async def release(self, slot: SlotRef, holder: str) -> None:
        await self._call(lambda: self._client.run_script(_RELEASE_LEASE, [self._key(slot)], [holder]))

    async def holder(self, slot: SlotRef) -> str | None:
        raw = await self._call(lambda: self._client.execute("GET", self._key(slot)))
        return None if raw is None else decoded(raw)

"""The prefix index in Redis: one Lua script per operation, one round trip each.

The slot leases (`redis_leases`) share these keys' prefix; both run on the clients of `redis_conn`.

Key schema (`P` = prefix, default `lf`; `M` = the model name, percent-encoded so that `:` in a model
name cannot make two models share keys, and `{`/`}` cannot end its hash tag). Every key of one model
starts `P:{M}:` (written `P:M:` below): the braces are a Redis Cluster hash tag, so one model's keys
share a hash slot and each script stays one round trip on one shard (on a single Redis they are only
part of the name). A model's keys are on one shard; a cluster spreads models, not one model's lookups.

- `P:M:b:{hash}`      ZSET, members `pod_uid#slot` (`SlotRef.key()`), score = the entry's deadline
                      (server ms). Scoring by deadline rather than last use lets every reader filter
                      expired members with one range query, whatever TTL the writer used.
- `P:M:slot:{slotkey}` HASH `chain` (the hashes as one string) and `w` (their width), or `blocks` (a
                      JSON list: hashes of mixed widths, and records before 2026-12-07), `n_tokens`,
                      `deadline`, `conv`, `head`: what the slot holds, so that `record_slot` can drop
                      the slot from blocks and tags it no longer holds.
- `P:M:conv:{tag}`    STRING slot key: the slot last recorded with this conversation tag, trusted only
                      while that slot's `conv` still is the tag.
- `P:M:head:{tag}`    SET of the slot keys whose latest record had this head tag.
- `P:M:snap:{hash}`   ZSET of snapshot ids whose LAST block is `hash`, scored by deadline.
- `P:M:snaplast`      SET of the block hashes some snapshot ends at: one SMISMEMBER per lookup finds
                      which of the query's blocks end a snapshot.
- `P:M:snaps`         HASH snapshot id -> JSON of the SnapshotRef plus its deadline. A snapshot id is
                      the JSON `[pod_uid, name]`, so no separator can be ambiguous.
- `P:M:pod:{uid}`     SET of JSON references to the pod's entries in the model, for `purge_pod`.
- `P:models`          SET, no TTL: the bases of the models that have had entries (each writer adds its
                      model's at most once a minute), so `purge_pod` finds a pod's sets in every model
                      without a cross-slot script. A model's base stays after its entries expired; an
                      expiry could not follow the entries written after the last SADD, and a fleet
                      serves a handful of models (purge then costs one empty script for it).
- `P:lease:{slotkey}` STRING holder, with PX expiry (a key per slot: leases spread over the shards).
- `P:M:fam:{family}:heads`, `...:points` ZSETs of a head family's latest heads and divergence points
                      (JSON members), scored by time, bounded, with the snapshot TTL.
- `P:instance`        STRING, no TTL: the index's present life; a new value means it lost its entries.
                      On a Cluster it is the life of the one shard that holds it: a shard that comes
                      back empty with no replica promoted in its place goes unnoticed (run replicas).

Every key but `P:models` and `P:instance` gets a PEXPIRE no shorter than its longest-lived entry, so
abandoned entries vanish on their own; readers additionally ignore members whose deadline has passed.
All times come from the Redis server's clock. Any failure (connection refused, timeout, a command
error) surfaces as `IndexUnavailable`, the router's cue to route without the index.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from llamafleet_core.index import redis_lua, redis_lua_snapshots
from llamafleet_core.index.base import (
    DEFAULT_PREFIX,
    DEFAULT_SLOT_TTL_S,
    DEFAULT_SNAPSHOT_TTL_S,
    FAMILY_HEADS,
    FAMILY_POINTS,
    check_snapshot,
    snapshot_order,
)
from llamafleet_core.index.redis_conn import DEFAULT_OP_TIMEOUT_S, RedisBase, connect_index, decoded, ms
from llamafleet_core.index.resp import IndexClient, LuaScript
from llamafleet_core.types import (
    DivergencePoint,
    HeadFamily,
    HeadRecord,
    Lookup,
    PromptTags,
    SlotRef,
    SnapshotRef,
)

_LOOKUP = LuaScript(redis_lua.LOOKUP)
_RECORD_SLOT = LuaScript(redis_lua.RECORD_SLOT)
_RECORD_SNAPSHOT = LuaScript(redis_lua_snapshots.RECORD_SNAPSHOT)
_FORGET_SNAPSHOT = LuaScript(redis_lua_snapshots.FORGET_SNAPSHOT)
_SNAPSHOTS = LuaScript(redis_lua_snapshots.SNAPSHOTS)
_PURGE_POD = LuaScript(redis_lua.PURGE_POD)
_RECORD_HEAD = LuaScript(redis_lua.RECORD_HEAD)
_FAMILY = LuaScript(redis_lua.FAMILY)
_INSTANCE = LuaScript(redis_lua.INSTANCE)
_REMEMBER_EVERY_S = 60.0  # how often a writer re-adds its model to `P:models` (it may have been lost)
_MAX_POINTS_PER_CALL = 98  # the script orders one call's points by score offsets below 99
_MAX_CACHED = 65_536  # parsed slot keys and snapshot payloads kept per index (a fleet has fewer)
_NO_TAGS = PromptTags()
_MAX_GROUPS = 4_096  # parsed reply groups kept per index (each up to a fleet's slots)


def _packed(blocks: Sequence[str]) -> list[str | int]:
    """Block hashes as the scripts take them: width and ONE string of fixed-width hashes when they all
    have one ASCII width (packing 240 arguments cost the client more than a lookup costs Redis), else
    0 and one argument per hash. ASCII, because Lua slices bytes."""
    width = len(blocks[0]) if blocks else 0
    if width and set(map(len, blocks)) == {width}:  # C-level checks: a generator cost ~0.1 ms
        blob = "".join(blocks)
        if blob.isascii():
            return [width, blob]
    return [0, *blocks]


def _snapshot_from_json(raw: Any) -> SnapshotRef:
    d = json.loads(decoded(raw))
    return SnapshotRef(
        name=str(d["name"]),
        pod_uid=str(d["pod_uid"]),
        n_blocks=int(d["n_blocks"]),
        n_tokens=int(d["n_tokens"]),
        size_bytes=int(d["size_bytes"]),
        last_block=str(d["last_block"]),
        n_chars=int(d.get("n_chars", 0)),
        text_hash=str(d.get("text_hash", "")),
    )


class RedisPrefixIndex(RedisBase):
    """`PrefixIndex` over Redis; see the module docstring for the key schema."""

    def __init__(
        self,
        client: IndexClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        snapshot_ttl_s: float = DEFAULT_SNAPSHOT_TTL_S,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
    ) -> None:
        super().__init__(client, prefix, op_timeout_s)
        self.slot_ttl_s = slot_ttl_s
        self.snapshot_ttl_s = snapshot_ttl_s
        self._refs: dict[str, SlotRef] = {}
        self._groups: dict[bytes, tuple[SlotRef, ...]] = {}
        self._snaps: dict[str, SnapshotRef] = {}
        self._remembered: dict[str, float] = {}  # model base -> when this index last added it to P:models

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.5, **kwargs: Any) -> RedisPrefixIndex:
        """An index that owns a fail-fast client (`connect_index`) and closes it in `close()`."""
        index = cls(connect_index(url, timeout_s=timeout_s), **kwargs)
        index._owns_client = True
        return index

    def _base(self, model: str) -> str:
        return f"{self._prefix}:{{{quote(model, safe='')}}}:"

    @staticmethod
    def _pod_key(base: str, pod_uid: str) -> str:
        return f"{base}pod:{quote(pod_uid, safe='')}"

    async def _remember(self, base: str) -> None:
        """Add the model to `P:models` before its first entry (and again every minute, in case Redis
        lost the set), so that `purge_pod` knows where to look. A failure raises, like the write would:
        an entry `purge_pod` could not find must not be written."""
        if time.monotonic() - self._remembered.get(base, -_REMEMBER_EVERY_S) < _REMEMBER_EVERY_S:
            return
        await self._call(lambda: self._client.execute("SADD", self._models_key(), base))
        self._remembered[base] = time.monotonic()

    def _models_key(self) -> str:
        return f"{self._prefix}:models"

    async def lookup(self, model: str, blocks: Sequence[str], tags: PromptTags | None = None) -> Lookup:
        if not blocks:
            return Lookup()
        width, *packed = _packed(blocks)
        tags = tags or _NO_TAGS
        keys = [self._base(model)]
        args = [width, tags.conversation or "", tags.head or "", tags.head_blocks, *packed]
        raw = await self._call(lambda: self._client.run_script(_LOOKUP, keys, args))
        slots: dict[SlotRef, int] = {}
        for i in range(3, len(raw) - 1, 2):
            group = raw[i + 1]
            refs = self._groups.get(group) or self._group(group)
            slots.update(dict.fromkeys(refs, int(raw[i])))
        snaps = decoded(raw[0])
        found = sorted((self._snapshot(s) for s in snaps.split("\n") if s), key=snapshot_order)
        key = decoded(raw[1])
        own = (self._refs.get(key) or self._ref(key)) if key else None
        exact = frozenset(self._groups.get(raw[2]) or self._group(raw[2])) if raw[2] else frozenset()
        return Lookup(slots=slots, snapshots=tuple(found), conversation=own if own in slots else None,
                      exact_head=exact)

    def _group(self, raw: bytes) -> tuple[SlotRef, ...]:
        """The slots of one reply group, parsed once per distinct group: sessions sharing a prefix
        keep answering with the same group (the same slots hold it), and parsing its ~200 keys one by
        one was a third of a lookup's client time."""
        if len(self._groups) >= _MAX_GROUPS:
            self._groups.clear()
        refs = self._groups[raw] = tuple(self._refs.get(k) or self._ref(k) for k in decoded(raw).split("\n"))
        return refs

    def _ref(self, key: str) -> SlotRef:
        """The one SlotRef of a slot key: parsed once, and identical objects make later dict lookups
        of it cheap (identity before equality). Bounded by the fleet's slots; cleared if it is not."""
        if len(self._refs) >= _MAX_CACHED:
            self._refs.clear()
        ref = self._refs[key] = SlotRef.parse(key)
        return ref

    def _snapshot(self, raw: str) -> SnapshotRef:
        """A snapshot from its catalog JSON, decoded once per distinct payload (a re-record changes it)."""
        snap = self._snaps.get(raw)
        if snap is None:
            if len(self._snaps) >= _MAX_CACHED:
                self._snaps.clear()
            snap = self._snaps[raw] = _snapshot_from_json(raw)
        return snap

    async def record_slot(
        self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int, tags: PromptTags | None = None
    ) -> None:
        tags = tags or _NO_TAGS
        base = self._base(model)
        if blocks:
            await self._remember(base)
        keys = [base, self._pod_key(base, slot.pod_uid)]
        args: list[str | int] = [
            slot.key(), ms(self.slot_ttl_s), n_tokens, tags.conversation or "", tags.head or "",
            *_packed(blocks),
        ]
        await self._call(lambda: self._client.run_script(_RECORD_SLOT, keys, args))

    async def forget_slot(self, model: str, slot: SlotRef) -> None:
        await self.record_slot(model, slot, (), 0)

    async def record_snapshot(self, model: str, snap: SnapshotRef, blocks: Sequence[str]) -> None:
        snap = check_snapshot(snap, blocks)
        payload = json.dumps(
            {"name": snap.name, "pod_uid": snap.pod_uid, "n_blocks": snap.n_blocks,
             "n_tokens": snap.n_tokens, "size_bytes": snap.size_bytes, "last_block": snap.last_block,
             "n_chars": snap.n_chars, "text_hash": snap.text_hash}
        )
        base = self._base(model)
        await self._remember(base)
        keys = [base, self._pod_key(base, snap.pod_uid)]
        args: list[str | int] = [json.dumps([snap.pod_uid, snap.name]), ms(self.snapshot_ttl_s), payload,
                                 snap.last_block]
        await self._call(lambda: self._client.run_script(_RECORD_SNAPSHOT, keys, args))

    async def forget_snapshot(self, model: str, name: str, pod_uid: str) -> None:
        base = self._base(model)
        keys = [base, self._pod_key(base, pod_uid)]
        args = [json.dumps([pod_uid, name])]
        await self._call(lambda: self._client.run_script(_FORGET_SNAPSHOT, keys, args))

    async def snapshots(self, model: str, pod_uid: str | None = None) -> list[SnapshotRef]:
        raw = await self._call(lambda: self._client.run_script(_SNAPSHOTS, [self._base(model)]))
        found = [_snapshot_from_json(r) for r in raw]
        return sorted((s for s in found if pod_uid is None or s.pod_uid == pod_uid),
                      key=lambda s: (s.name, s.pod_uid))

    async def purge_pod(self, pod_uid: str) -> int:
        """One script per model with entries (`P:models`): each model's keys are on a shard of their own."""
        bases = await self._call(lambda: self._client.execute("SMEMBERS", self._models_key()))
        removed = 0
        for base in sorted(map(decoded, bases)):
            purge = functools.partial(self._client.run_script, _PURGE_POD, [self._pod_key(base, pod_uid)])
            removed += int(await self._call(purge))
        return removed

    async def instance(self) -> str:
        keys, args = [f"{self._prefix}:instance"], [uuid.uuid4().hex]
        return decoded(await self._call(lambda: self._client.run_script(_INSTANCE, keys, args)))

    def _family_keys(self, model: str, family: str) -> tuple[str, str]:
        base = f"{self._base(model)}fam:{quote(family, safe='')}:"
        return base + "heads", base + "points"

    async def record_head(
        self, model: str, family: str, head: HeadRecord, points: Sequence[DivergencePoint] = (),
    ) -> None:
        members = [json.dumps([p.chars, p.from_end, p.text_hash]) for p in dict.fromkeys(points)]
        keys = list(self._family_keys(model, family))
        args: list[str | int] = [
            ms(self.snapshot_ttl_s), FAMILY_HEADS, FAMILY_POINTS,
            json.dumps([head.n_chars, head.text_hash, list(head.cuts)]), *members[:_MAX_POINTS_PER_CALL],
        ]
        await self._call(lambda: self._client.run_script(_RECORD_HEAD, keys, args))

    async def family(self, model: str, family: str) -> HeadFamily:
        keys = list(self._family_keys(model, family))
        raw = await self._call(lambda: self._client.run_script(_FAMILY, keys))
        heads = [json.loads(decoded(r)) for r in raw[0]]
        points = [json.loads(decoded(r)) for r in raw[1]]
        return HeadFamily(tuple(HeadRecord(tuple(b), int(n), str(h)) for n, h, b in heads),
                          tuple(DivergencePoint(int(c), int(e), str(h)) for c, e, h in points))

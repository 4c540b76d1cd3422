"""Fleet membership in Redis: how routers in a cluster learn the pods, written by the operator.

Why Redis and not a pod watch in the router: the router then needs no Kubernetes client, no RBAC to
list pods, and no watch per replica; it already reads Redis for the prefix index, and the operator
already knows what a router cannot see from a pod object alone (which pods hold the fleet's shared
prefixes, the slot count, whether attach is on). The operator is the only writer.

Key schema (`P` = prefix, default `lf`, the index's; `F` = `namespace/fleet`; `M` = `P:{membership}`,
whose braces are a Redis Cluster hash tag: the MULTI below spans keys, which a Cluster allows only
within one hash slot):

- `M:members:{F}`   HASH pod uid -> JSON member (below). Rewritten whole on every fleet reconcile (DEL +
                    HSET in one MULTI), so a pod that left disappears at once. No expiry: routers keep
                    routing to the last known pods while the operator restarts; `M:members-at:{F}`
                    (STRING, ms since 1970) says how fresh the hash is.
- `M:fleets`        SET of every `F` with a membership hash (for routers that serve all fleets).
- channel `P:members`  PUBLISH of `F` after every change, so routers refresh without waiting for a poll.

Releases before the hash tag wrote the same keys under `P:` itself. A router reads those while a fleet
has no tagged hash yet, and the operator deletes them at its first write, so a gateway and an operator
upgraded in either order keep routing.

A member (JSON, camelCase): `name`, `uid` (the Kubernetes pod uid), `ip`, `port` (llama-server),
`agentPort`, `slots`, `model`, `ready` (Ready in Kubernetes: containers ready AND the fleet's shared
prefixes warm, see the readiness gate), `epoch` (pod start time in ms: with `uid` it fences index entries,
so a replaced pod never inherits its predecessor's), `attach`, `warm` (names of the SharedPrefixes the
pod holds), and `sig` when the operator has a membership key (membership_signing.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from llamafleet_core.index.redis_conn import RedisLike
from llamafleet_core.membership_signing import Scope, seal
from llamafleet_core.networks import url_host
from llamafleet_core.types import Endpoint, PodRef

DEFAULT_PREFIX = "lf"


@dataclass(frozen=True)
class Member:
    """One pod of a fleet, as routers need it."""

    name: str
    uid: str
    ip: str
    port: int
    agent_port: int
    slots: int
    model: str
    ready: bool
    epoch: int
    attach: bool = False
    cache_prefix: bool = False
    warm: tuple[str, ...] = field(default=())

    @property
    def url(self) -> str:
        return f"http://{url_host(self.ip)}:{self.port}"

    @property
    def agent_url(self) -> str:
        return f"http://{url_host(self.ip)}:{self.agent_port}"

    def endpoint(self) -> Endpoint:
        """The router's view of this pod."""
        return Endpoint(
            pod=PodRef(name=self.name, uid=self.uid, epoch=self.epoch),
            url=self.url, model=self.model, n_slots=self.slots, agent_url=self.agent_url,
            ready=self.ready, attach=self.attach, cache_prefix=self.cache_prefix,
        )


def encode(member: Member) -> str:
    return json.dumps({
        "name": member.name, "uid": member.uid, "ip": member.ip, "port": member.port,
        "agentPort": member.agent_port, "slots": member.slots, "model": member.model,
        "ready": member.ready, "epoch": member.epoch, "attach": member.attach,
        "cachePrefix": member.cache_prefix, "warm": list(member.warm),
    }, sort_keys=True, separators=(",", ":"))


def decode(raw: str | bytes) -> Member:
    """Inverse of `encode`; raises ValueError (or KeyError) on a malformed entry."""
    return from_fields(json.loads(raw))


def from_fields(data: dict[str, Any]) -> Member:
    """A member from an entry's parsed fields (unknown ones, like `sig`, are ignored)."""
    return Member(
        name=str(data["name"]), uid=str(data["uid"]), ip=str(data["ip"]), port=int(data["port"]),
        agent_port=int(data["agentPort"]), slots=int(data["slots"]), model=str(data["model"]),
        ready=bool(data["ready"]), epoch=int(data["epoch"]), attach=bool(data.get("attach", False)),
        cache_prefix=bool(data.get("cachePrefix", False)), warm=tuple(str(w) for w in data.get("warm") or ()),
    )


def fleet_id(namespace: str, fleet: str) -> str:
    return f"{namespace}/{fleet}"


def _tagged(prefix: str) -> str:
    return f"{prefix}:{{membership}}"


def members_key(namespace: str, fleet: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{_tagged(prefix)}:members:{fleet_id(namespace, fleet)}"


async def write_members(redis: RedisLike, namespace: str, fleet: str, members: Sequence[Member],
                        *, prefix: str = DEFAULT_PREFIX, signing_key: bytes = b"") -> bool:
    """Replace the fleet's membership (each entry signed with `signing_key` unless b""); returns
    whether it changed (and routers were notified)."""
    key = members_key(namespace, fleet, prefix)
    scope = Scope(prefix, namespace, fleet)
    wanted = {m.uid: seal(encode(m), scope, signing_key) if signing_key else encode(m) for m in members}
    stored = await _hash(redis, key)
    fid = fleet_id(namespace, fleet)
    # What routers read now: an older operator's untagged hash while there is no tagged one.
    current = stored or await _hash(redis, f"{prefix}:members:{fid}")
    async with redis.pipeline(transaction=True) as pipe:
        if stored != wanted:
            pipe.delete(key)
            if wanted:
                pipe.hset(key, mapping=cast(Mapping[Any, Any], wanted))
        pipe.sadd(f"{_tagged(prefix)}:fleets", fid)
        pipe.set(f"{_tagged(prefix)}:members-at:{fid}", str(int(time.time() * 1000)))
        await pipe.execute()
    await _drop_untagged(redis, prefix, fid)
    if current != wanted:
        await redis.publish(f"{prefix}:members", fid)
    return current != wanted


async def read_entries(redis: RedisLike, namespace: str, fleet: str,
                       *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The fleet's entries as stored (JSON text), unchecked; the untagged hash of an older operator while
    there is no tagged one."""
    found = await _hash(redis, members_key(namespace, fleet, prefix))
    return list((found or await _hash(redis, f"{prefix}:members:{fleet_id(namespace, fleet)}")).values())


async def read_members(redis: RedisLike, namespace: str, fleet: str,
                       *, prefix: str = DEFAULT_PREFIX) -> list[Member]:
    """The fleet's pods, ordered by name, signatures unchecked (the router checks them:
    discovery/signatures.py); malformed entries are skipped, not fatal."""
    out = []
    for raw in await read_entries(redis, namespace, fleet, prefix=prefix):
        try:
            out.append(decode(raw))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(out, key=lambda m: m.name)


async def remove_fleet(redis: RedisLike, namespace: str, fleet: str,
                       *, prefix: str = DEFAULT_PREFIX) -> None:
    fid = fleet_id(namespace, fleet)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(members_key(namespace, fleet, prefix), f"{_tagged(prefix)}:members-at:{fid}")
        pipe.srem(f"{_tagged(prefix)}:fleets", fid)
        await pipe.execute()
    await _drop_untagged(redis, prefix, fid)
    await redis.publish(f"{prefix}:members", fid)


async def list_fleets(redis: RedisLike, *, prefix: str = DEFAULT_PREFIX) -> list[tuple[str, str]]:
    """(namespace, fleet) of every fleet with a membership hash."""
    out = []
    names = await redis.smembers(f"{_tagged(prefix)}:fleets") | await redis.smembers(f"{prefix}:fleets")
    for raw in names:
        namespace, _, fleet = _text(raw).partition("/")
        out.append((namespace, fleet))
    return sorted(out)


async def _hash(redis: RedisLike, key: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in (await redis.hgetall(key)).items()}


async def _drop_untagged(redis: RedisLike, prefix: str, fid: str) -> None:
    """Delete an older operator's untagged keys of the fleet, one command each: on a Cluster they hash
    to other slots than the MULTI's."""
    await redis.delete(f"{prefix}:members:{fid}")
    await redis.delete(f"{prefix}:members-at:{fid}")
    await redis.srem(f"{prefix}:fleets", fid)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

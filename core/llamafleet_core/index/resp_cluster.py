"""The index's client for a Redis Cluster: one `RespClient` per master, each command sent to the master
serving the hash slot of its first key.

Why not redis-py's cluster client on the request path: the same reason as for one Redis (`resp.py`):
the index runs a script per lookup, and through redis-py most of its time is Python per command. The
index's keys carry hash tags (`cluster.py`), so a script is one round trip on one shard, as on one Redis.

How it behaves:
- The slot map comes from `CLUSTER SLOTS`, asked of the seed nodes (and later of any node it knows) on
  first use, and again after a redirect or a failure, at most once per `refresh_s` (one refresh at a
  time: the callers that failed together share it).
- `MOVED`: the slot has a new master; the map learns it and the command goes there. `ASK`: the slot is
  being migrated; this one command goes to the node named, after `ASKING`. `TRYAGAIN` and `CLUSTERDOWN`
  (a migration or a failover in progress): the map is refreshed and the command tried again.
- A master that cannot be reached fails its commands with `ConnectionError` (the router routes without
  the index meanwhile), after one retry on the map's new owner when a refresh already names one: once
  the Cluster has promoted a replica, the next command reaches it. A timeout is not retried: the
  command may have run, and the caller's deadline is nearly spent.
- Per node, everything `RespClient` does: pipelining, fast failure while a node is down, EVALSHA.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llamafleet_core.index.cluster import (
    ClusterURL,
    Node,
    Topology,
    key_slot,
    parse_cluster_url,
    parse_redirect,
    topology,
)
from llamafleet_core.index.resp import Address, LuaScript, RespClient, RespError, tls_context

_ATTEMPTS = 4  # redirects and retries of one command: a MOVED, then an ASK, then a failover's retry
_BUSY = ("TRYAGAIN", "CLUSTERDOWN")


class ClusterClient:
    """`IndexClient` over a Redis Cluster; see the module docstring for how it routes and fails."""

    def __init__(self, url: ClusterURL, *, timeout_s: float = 0.5, redial_s: float = 0.2,
                 refresh_s: float = 0.1) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.redial_s = redial_s
        self.refresh_s = refresh_s
        self._tls = tls_context(url.tls_options) if url.tls else None
        self._nodes: dict[Node, RespClient] = {}
        self._map: Topology | None = None
        self._refreshed_at = float("-inf")
        self._refreshing: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.5, redial_s: float = 0.2) -> ClusterClient:
        return cls(parse_cluster_url(url), timeout_s=timeout_s, redial_s=redial_s)

    async def execute(self, *args: Any) -> Any:
        """One command, routed by its first argument after the name (the key, in every command the
        index sends); a keyless command goes to any master."""
        key = args[1] if len(args) > 1 else None
        return await self._routed(key, lambda node, asking: node.execute(*args, asking=asking))

    async def run_script(self, script: LuaScript, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """A script, on the master of its first key's slot (the index's scripts touch only that slot)."""
        return await self._routed(keys[0] if keys else None,
                                  lambda node, asking: node.run_script(script, keys, args, asking=asking))

    async def ping(self) -> bool:
        """Whether every master answers: the index is whole only then. A master that does not answer
        sends it to the cluster for a new map first (a replica may have taken its place)."""
        if await self._masters_answer(await self._topology()):
            return True
        return await self._masters_answer(await self._refresh(force=False))

    async def _masters_answer(self, found: Topology) -> bool:
        if not found.masters or None in found.owners:
            return False
        replies = await asyncio.gather(*(self._node(n).ping() for n in found.masters), return_exceptions=True)
        return all(reply is True for reply in replies)

    async def aclose(self) -> None:
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.aclose()

    async def _routed(self, key: Any, call: Callable[[RespClient, bool], Awaitable[Any]]) -> Any:
        slot = None if key is None else key_slot(key if isinstance(key, (str, bytes)) else str(key))
        ask: Node | None = None
        failure: Exception | None = None
        for _ in range(_ATTEMPTS):
            target = ask or self._owner(await self._topology(), slot)
            try:
                return await call(self._node(target), ask is not None)
            except RespError as exc:
                redirect = parse_redirect(str(exc), target)
                failure, ask = exc, None
                if redirect is not None and redirect.moved:
                    self._learn(redirect.slot, redirect.node)
                    await self._refresh(force=False)  # one MOVED often means a whole failover
                elif redirect is not None:
                    ask = redirect.node
                elif str(exc).startswith(_BUSY):
                    await self._refresh(force=False)
                else:
                    raise
            except ConnectionError as exc:
                failure, ask = exc, None
                if self._owner(await self._refresh(force=False), slot) == target:
                    raise  # the map still names the node that failed: nothing better to try
        assert failure is not None
        raise failure

    def _owner(self, found: Topology, slot: int | None) -> Node:
        owner = min(found.masters, default=None) if slot is None else found.owners[slot]
        if owner is None:
            raise ConnectionError("redis cluster: no master serves this slot (the cluster is incomplete)")
        return owner

    def _learn(self, slot: int, node: Node) -> None:
        if self._map is not None:
            owners = list(self._map.owners)
            owners[slot] = node
            self._map = Topology(tuple(owners), self._map.nodes | {node})

    async def _topology(self) -> Topology:
        return self._map if self._map is not None else await self._refresh(force=True)

    async def _refresh(self, *, force: bool) -> Topology:
        """Ask the nodes it knows (masters first, then replicas and seeds) for the slot map; the first
        answer wins. Without `force`, a map younger than `refresh_s` is kept."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            known = self._map
            if known is not None and (not force and time.monotonic() - self._refreshed_at < self.refresh_s):
                return known
            said: list[str] = []
            for node in self._sources(known):
                try:
                    reply = await self._node(node).execute("CLUSTER", "SLOTS")
                except (RespError, OSError, TimeoutError) as exc:
                    said.append(f"{node[0]}:{node[1]}: {type(exc).__name__}: {exc}")
                    continue
                self._map, self._refreshed_at = topology(reply, node), time.monotonic()
                return self._map
            self._refreshed_at = time.monotonic()
            if known is not None:
                return known
            raise ConnectionError("redis cluster: no node answered CLUSTER SLOTS: " + "; ".join(said))

    def _sources(self, known: Topology | None) -> list[Node]:
        masters = sorted(known.masters) if known else []
        others = sorted(known.nodes - set(masters)) if known else []
        return list(dict.fromkeys([*masters, *others, *self.url.seeds]))

    def _node(self, node: Node) -> RespClient:
        client = self._nodes.get(node)
        if client is None:
            address = Address(host=node[0], port=node[1], username=self.url.username,
                              password=self.url.password, tls=self._tls)
            client = self._nodes[node] = RespClient(address, timeout_s=self.timeout_s, redial_s=self.redial_s)
        return client

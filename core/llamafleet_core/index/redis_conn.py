"""Connecting to Redis, and the one way the index and the leases run an operation on it.

Apart from `redis_index` because the leases run on it too: a deadline on every operation and every
failure mapped to `IndexUnavailable`, the router's cue to route without the index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.cluster import ClusterURL, is_cluster_url, parse_cluster_url
from llamafleet_core.index.resp import IndexClient, RespClient, RespError
from llamafleet_core.index.resp_cluster import ClusterClient
from llamafleet_core.index.sentinel import is_sentinel_url, parse_sentinel_url

T = TypeVar("T")
DEFAULT_OP_TIMEOUT_S = 1.0


RedisLike = aioredis.Redis | RedisCluster  # what `connect` gives: one Redis (or Sentinel's master), a Cluster


def connect_index(url: str, *, timeout_s: float = 0.5) -> IndexClient:
    """The client `RedisPrefixIndex` and `RedisSlotLeases` run on: the lean pipelined one (`resp.py`;
    `resp_cluster.py` for a Cluster URL), failing fast (a reply later than `timeout_s` counts as Redis
    down), since the router would rather route without the index now than wait for it."""
    if is_cluster_url(url):
        return ClusterClient.from_url(url, timeout_s=timeout_s)
    return RespClient.from_url(url, timeout_s=timeout_s)


def connect(url: str, *, timeout_s: float = 0.5) -> RedisLike:
    """A redis-py client for everything off the request path (membership): short socket timeouts and
    one immediate retry, which re-dials a pooled connection that died with a restarted server. A
    Sentinel URL (sentinel.py) gives redis-py's own master client, which asks the Sentinels again on
    every new connection; a Cluster URL (cluster.py) redis-py's cluster client."""
    if is_cluster_url(url):
        return _cluster(parse_cluster_url(url), timeout_s)
    if is_sentinel_url(url):
        found = parse_sentinel_url(url)
        watched = found.sentinels
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(watched.nodes), socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            sentinel_kwargs={"password": watched.password, "socket_timeout": timeout_s,
                             "socket_connect_timeout": timeout_s})
        master: aioredis.Redis = sentinel.master_for(
            watched.service, db=found.db, username=found.username, password=found.password,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1))
        return master
    client: aioredis.Redis = aioredis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
    )
    return client


def _cluster(found: ClusterURL, timeout_s: float) -> RedisCluster:
    tls: dict[str, Any] = {}
    if found.tls:
        tls = {"ssl": True, "ssl_cert_reqs": found.tls_options.get("ssl_cert_reqs", "required"),
               "ssl_ca_certs": found.tls_options.get("ssl_ca_certs")}
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in found.seeds], username=found.username,
        password=found.password, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1), **tls)


def decoded(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisBase:
    """What both Redis classes share: the injected client, the prefix and error translation."""

    def __init__(self, client: IndexClient, prefix: str, op_timeout_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._op_timeout_s = op_timeout_s
        self._owns_client = False

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis operation with a hard deadline, mapping every failure to IndexUnavailable."""
        try:
            async with asyncio.timeout(self._op_timeout_s):
                return await op()
        except (RespError, OSError, TimeoutError) as exc:
            raise IndexUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def ping(self) -> bool:
        try:
            return bool(await self._call(self._client.ping))
        except IndexUnavailable:
            return False

    async def close(self) -> None:
        """Close the client only if this object created it (`from_url`); an injected one is the caller's."""
        if self._owns_client:
            await self._client.aclose()

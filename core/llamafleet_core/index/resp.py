"""A lean Redis client for the prefix index: one pipelined connection, replies parsed by hiredis.

Why not redis-py here: the index sits on every request's decision path, and the index only ever runs
Lua scripts and a few plain commands. Through redis-py most of a lookup's or a lease's time is its
Python per command (pool checkout, command packing, response callbacks), not Redis's (docs/design.md,
"Index client", for the figures). Everything that is
not on the request path (membership, the operator's writes) stays on redis-py.

How it behaves:
- One connection (TCP, TLS for `rediss://`, or a unix socket), dialled on first use and shared by every
  caller. Commands are pipelined: RESP answers in command order, so replies are matched to waiters FIFO.
- A caller cancelled from outside (its client went away) abandons its reply; the reply is read and
  dropped when it comes. A reply that does not come within `timeout_s` closes the connection: Redis is
  stalled or gone, and the next command dials again rather than queueing behind it.
- A lost connection fails every command in flight with `ConnectionError`. After a failed dial, commands
  fail at once for `redial_s`: a Redis that is down then costs a request nothing, instead of a connect
  attempt each (the router routes without the index meanwhile).
- Scripts run by EVALSHA; a server that lost its script cache (restarted, flushed) gets EVAL once.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

from llamafleet_core.index.resp_wire import Connection, pack
from llamafleet_core.index.sentinel import (
    Sentinels,
    is_master,
    is_sentinel_url,
    master_address,
    parse_sentinel_url,
)


class RespError(Exception):
    """An error reply from Redis (a failing command or script), with Redis's message."""


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A Lua script and its SHA1, computed once."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect, from a `redis://`, `rediss://`, `unix://` or `redis+sentinel://` URL
    (`sentinels`: the master is asked of them at every dial, and `host`/`port` are unused)."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a unix socket
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    sentinels: Sentinels | None = None

    @classmethod
    def from_url(cls, url: str) -> Address:
        """Parse a Redis URL; anything this client would silently ignore is a `ValueError`."""
        if is_sentinel_url(url):
            found = parse_sentinel_url(url)
            return cls(db=found.db, username=found.username, password=found.password,
                       sentinels=found.sentinels)
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"Redis URL scheme must be redis, rediss, unix, redis+sentinel or "
                             f"redis+cluster/rediss+cluster, not {parts.scheme!r}")
        unknown = set(query) - {"db", "password", "username", "ssl_cert_reqs", "ssl_ca_certs"}
        if unknown:
            raise ValueError(f"unsupported Redis URL option(s): {', '.join(sorted(unknown))}")
        db_text = query.get("db") if parts.scheme == "unix" else (query.get("db") or parts.path.lstrip("/"))
        try:
            db = int(db_text or 0)
            port = parts.port or 6379
        except ValueError as exc:
            raise ValueError(f"bad Redis URL {redacted_url(url)!r}: {exc}") from None
        username = unquote(parts.username) if parts.username else query.get("username")
        password = unquote(parts.password) if parts.password is not None else query.get("password")
        tls = tls_context(query) if parts.scheme == "rediss" else None
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// Redis URL needs a socket path")
            return cls(path=parts.path, db=db, username=username, password=password or None)
        return cls(host=parts.hostname or "127.0.0.1", port=port, db=db, username=username or None,
                   password=password or None, tls=tls)


def tls_context(query: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=query.get("ssl_ca_certs") or None)
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in ("none", "optional", "required"):
        raise ValueError(f"ssl_cert_reqs must be none, optional or required, not {reqs!r}")
    if reqs != "required":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE if reqs == "none" else ssl.CERT_OPTIONAL
    return ctx


_SECRET_OPTIONS = re.compile(r"([?&](?:password|sentinel_password)=)[^&#]*")


def redacted_url(url: str) -> str:
    """`url` with its passwords (the userinfo's, and `password`/`sentinel_password` options) replaced by
    `***`: for logs, reports and state files."""
    parts = urlsplit(url)
    if parts.password is not None:
        url = url.replace(f":{parts.password}@", ":***@", 1)
    return _SECRET_OPTIONS.sub(r"\1***", url)


class IndexClient(Protocol):
    """What the index and the leases run on: `RespClient` (one Redis, or a Sentinel-watched master) or
    `resp_cluster.ClusterClient` (a Redis Cluster). A script's first key says where it runs."""

    async def execute(self, *args: Any) -> Any: ...

    async def run_script(
        self, script: LuaScript, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any: ...

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...


class RespClient:
    """A pipelined client over one connection; see the module docstring for its failure behaviour."""

    def __init__(self, address: Address, *, timeout_s: float = 0.5, redial_s: float = 0.2) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.redial_s = redial_s
        self._conn: Connection | None = None
        self._dialling: asyncio.Lock | None = None
        self._dial_failed: tuple[float, Exception] | None = None

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.5, redial_s: float = 0.2) -> RespClient:
        return cls(Address.from_url(url), timeout_s=timeout_s, redial_s=redial_s)

    async def execute(self, *args: Any, asking: bool = False) -> Any:
        """Send one command and return its reply (bytes, int, list, None); a `RespError` for an error
        reply; `ConnectionError` or `TimeoutError` when Redis cannot answer. `asking`: `ASKING` first, on
        the same connection right before it (a Cluster's `ASK` redirect, resp_cluster.py); nothing can
        come between, since both are written before this coroutine yields."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connect()
        asked = conn.send(pack(("ASKING",))) if asking else None
        waiter = conn.send(pack(args))
        # The connection's own watchdog (`timeout_s`) closes it and fails both with TimeoutError.
        if asked is not None:
            await asked
        reply = await waiter
        if isinstance(reply, hiredis.ReplyError):
            if str(reply).startswith("READONLY"):
                # A replica now (a failover demoted it): the next command dials the master anew.
                conn.close(ConnectionError(f"redis is a replica now: {reply}"))
                raise ConnectionError(f"redis is a replica now: {reply}")
            raise RespError(str(reply))
        return reply

    async def run_script(self, script: LuaScript, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                         *, asking: bool = False) -> Any:
        """EVALSHA, falling back to EVAL (which also caches it) when Redis does not know the script."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args, asking=asking)
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self.execute("EVAL", script.source, len(keys), *keys, *args, asking=asking)

    async def ping(self) -> bool:
        return bool(await self.execute("PING"))

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close(ConnectionError("redis client closed"))
            self._conn = None

    async def _connect(self) -> Connection:
        if self._dialling is None:
            self._dialling = asyncio.Lock()
        async with self._dialling:  # one dial at a time: the others wait and share it
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            failed = self._dial_failed
            if failed is not None and time.monotonic() - failed[0] < self.redial_s:
                raise ConnectionError(f"redis unreachable (retrying shortly): {failed[1]}")
            try:
                conn = await self._dial()
            except (OSError, TimeoutError, RespError) as exc:
                self._dial_failed = (time.monotonic(), exc)
                raise ConnectionError(f"cannot connect to redis: {exc}") from exc
            self._dial_failed = None
            self._conn = conn
            return conn

    def _protocol(self) -> Connection:
        return Connection(self.timeout_s)

    async def _dial(self) -> Connection:
        loop = asyncio.get_running_loop()
        a = self.address
        host, port = a.host, a.port
        if a.sentinels is not None:
            host, port = await master_address(a.sentinels, self.timeout_s)
        async with asyncio.timeout(self.timeout_s):
            if a.path is not None:
                _, conn = await loop.create_unix_connection(self._protocol, a.path)
            else:
                _, conn = await loop.create_connection(
                    self._protocol, host, port, ssl=a.tls, server_hostname=host if a.tls else None)
            try:
                for command in _handshake(a):
                    reply = await conn.send(pack(command))
                    if isinstance(reply, hiredis.ReplyError):
                        raise RespError(f"{command[0]}: {reply}")
                # A Sentinel that has not seen a failover yet names the old master, maybe a replica now.
                if a.sentinels is not None and not is_master(await conn.send(pack(["ROLE"]))):
                    raise ConnectionError(f"{host}:{port}, named by the Sentinels, is not the master (yet)")
            except BaseException:
                conn.close(ConnectionError("redis handshake failed"))
                raise
        return conn


def _handshake(a: Address) -> list[list[Any]]:
    commands: list[list[Any]] = []
    if a.password is not None:
        commands.append(["AUTH", a.username, a.password] if a.username else ["AUTH", a.password])
    if a.db:
        commands.append(["SELECT", a.db])
    return commands

"""Redis Sentinel for the index: which server is the master now, asked of the Sentinels.

A Sentinel URL names the Sentinels and the service they watch; the index's client (`resp.py`) and the
redis-py client of everything off the request path (`redis_conn.connect`) both take it:

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]

The userinfo's password is the master's (the replicas share it); Sentinels that require a password of
their own take `sentinel_password`. Port 26379 when a host names none.

How the index fails over: a master that dies fails every command in flight (the router routes without
the index meanwhile, `IndexUnavailable`); every dial then asks the Sentinels in turn for the master's
address and checks with `ROLE` that the server it reached is the master (a Sentinel that has not seen
the failover yet names the old one). A write refused with `READONLY` (the old master came back as a
replica under a connection kept open) closes the connection, so the next command dials the master anew.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

import hiredis

from llamafleet_core.index.resp_wire import Connection, pack

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
_OPTIONS = frozenset({"db", "password", "username", "sentinel_password"})


@dataclass(frozen=True, slots=True)
class Sentinels:
    """The Sentinels to ask, in order, and the service (master name) they watch."""

    nodes: tuple[tuple[str, int], ...]
    service: str
    password: str | None = None  # the Sentinels' own, when they require one


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed Sentinel URL: where to ask, and how to log in to the master it names."""

    sentinels: Sentinels
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse a `redis+sentinel://` URL (pure); anything it cannot use is a `ValueError` naming it."""
    if not is_sentinel_url(url):
        raise ValueError(f"a Sentinel URL starts with {SCHEME}://")
    rest = url[len(SCHEME) + 3:]
    rest, _, query_text = rest.partition("?")
    query = {k: v[-1] for k, v in parse_qs(query_text, keep_blank_values=True).items()}
    unknown = set(query) - _OPTIONS
    if unknown:
        raise ValueError(f"unsupported Sentinel URL option(s): {', '.join(sorted(unknown))}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    nodes = tuple(host_port(part, DEFAULT_SENTINEL_PORT, "Sentinel")
                  for part in hosts.split(",") if part.strip())
    if not nodes:
        raise ValueError("a Sentinel URL names at least one Sentinel (host:port)")
    service, _, db_text = path.partition("/")
    if not service:
        raise ValueError("a Sentinel URL names the service after the hosts: redis+sentinel://host:port/mymaster")
    try:
        db = int(query.get("db") or db_text or 0)
    except ValueError:
        raise ValueError(f"bad database number in a Sentinel URL: {db_text or query.get('db')!r}") from None
    sentinels = Sentinels(nodes, unquote(service), query.get("sentinel_password") or None)
    return SentinelURL(sentinels, db, unquote(username) or query.get("username") or None,
                       unquote(password) or query.get("password") or None)


def host_port(part: str, default_port: int, what: str) -> tuple[str, int]:
    """One `host[:port]` of a URL that names several servers (this one's Sentinels, a Cluster URL's
    seed nodes); `what` names them in the error."""
    host, colon, port_text = part.strip().rpartition(":")
    if not colon:
        host, port_text = port_text, ""
    host = host.strip("[]")  # an IPv6 literal
    if not host:
        raise ValueError(f"a {what} needs a host: {part!r}")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"bad {what} port in {part!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad {what} port in {part!r}")
    return host, port


async def master_address(sentinels: Sentinels, timeout_s: float) -> tuple[str, int]:
    """The master's (host, port), from the first Sentinel that names it; `ConnectionError` naming what
    each one said when none does."""
    loop = asyncio.get_running_loop()
    said: list[str] = []
    for host, port in sentinels.nodes:
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(Connection, host, port)
                try:
                    if sentinels.password is not None:
                        _check(await conn.send(pack(["AUTH", sentinels.password])))
                    reply = await conn.send(pack(["SENTINEL", "get-master-addr-by-name", sentinels.service]))
                finally:
                    conn.close(ConnectionError("sentinel query done"))
        except (OSError, TimeoutError, ConnectionError) as exc:
            said.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
            continue
        if isinstance(reply, list) and len(reply) == 2:
            try:
                return _text(reply[0]), int(reply[1])
            except ValueError:
                pass
        said.append(f"{host}:{port}: no master named {sentinels.service!r} ({reply!r})")
    raise ConnectionError(f"no Sentinel named the master of {sentinels.service!r}: " + "; ".join(said))


def is_master(role_reply: Any) -> bool:
    """Whether a `ROLE` reply is a master's (pure)."""
    return isinstance(role_reply, list) and bool(role_reply) and _text(role_reply[0]) == "master"


def _check(reply: Any) -> None:
    if isinstance(reply, hiredis.ReplyError):
        raise ConnectionError(f"sentinel refused: {reply}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

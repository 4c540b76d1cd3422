"""Redis Cluster for the index, the pure part: its URL, which hash slot a key is in, who serves a slot.

A Cluster URL names seed nodes, any of the cluster's (the client asks one for the rest); `rediss+` is TLS:

    redis+cluster://[[user]:password@]host:port[,host:port...][/][?password=...&username=...]
    rediss+cluster://...[?ssl_cert_reqs=required|optional|none&ssl_ca_certs=PATH]

Port 6379 when a host names none. A Cluster has database 0 only, so a URL naming another is refused.

The index's keys carry hash tags (`redis_index`, `redis_leases`, `membership`), so everything one script
or one MULTI touches is in one hash slot; `resp_cluster` sends each command to the master serving the
slot of its first key, as `CLUSTER SLOTS` said or a `MOVED`/`ASK` redirect corrects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from llamafleet_core.index.sentinel import host_port

SCHEMES = ("redis+cluster", "rediss+cluster")
SLOTS = 16384
DEFAULT_PORT = 6379
_OPTIONS = frozenset({"password", "username", "ssl_cert_reqs", "ssl_ca_certs"})
Node = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed Cluster URL: where to start, and how to log in to every node."""

    seeds: tuple[Node, ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_options: dict[str, str] = field(default_factory=dict)  # ssl_cert_reqs, ssl_ca_certs


def is_cluster_url(url: str) -> bool:
    return url.startswith(tuple(f"{scheme}://" for scheme in SCHEMES))


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse a Cluster URL (pure); anything it cannot use is a `ValueError` naming it."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"a Cluster URL starts with {' or '.join(s + '://' for s in SCHEMES)}")
    rest, _, query_text = rest.partition("?")
    query = {k: v[-1] for k, v in parse_qs(query_text, keep_blank_values=True).items()}
    unknown = set(query) - _OPTIONS
    if unknown:
        raise ValueError(f"unsupported Cluster URL option(s): {', '.join(sorted(unknown))}")
    tls = scheme == "rediss+cluster"
    if not tls and {"ssl_cert_reqs", "ssl_ca_certs"} & set(query):
        raise ValueError("ssl_cert_reqs and ssl_ca_certs need TLS: rediss+cluster://")
    netloc, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {path.strip('/')!r}")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    seeds = tuple(host_port(part, DEFAULT_PORT, "Cluster node") for part in hosts.split(",") if part.strip())
    if not seeds:
        raise ValueError("a Cluster URL names at least one node (host:port)")
    return ClusterURL(seeds, unquote(username) or query.get("username") or None,
                      unquote(password) or query.get("password") or None, tls,
                      {k: v for k, v in query.items() if k.startswith("ssl_")})


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def key_slot(key: str | bytes) -> int:
    """The hash slot of `key`: CRC16 (XMODEM) of its hash tag, the text between the first `{` and the
    next `}` when that is not empty, else of the whole key (the Cluster specification's rule)."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc % SLOTS


@dataclass(frozen=True, slots=True)
class Redirect:
    """A `MOVED` (the slot has a new master: remember it) or `ASK` (this one command goes there, after
    `ASKING`: the slot is being migrated) error reply."""

    moved: bool
    slot: int
    node: Node


def parse_redirect(message: str, replied_from: Node) -> Redirect | None:
    """`MOVED 3999 10.0.0.2:6381` or `ASK ...` -> a Redirect; None for any other error. An empty host
    (Redis 7 may send `:6381`) means the node that replied."""
    kind, _, rest = message.partition(" ")
    if kind not in ("MOVED", "ASK"):
        return None
    slot_text, _, address = rest.strip().partition(" ")
    host, colon, port_text = address.rpartition(":")
    try:
        slot, port = int(slot_text), int(port_text)
    except ValueError:
        return None
    if not colon or not 0 <= slot < SLOTS:
        return None
    return Redirect(kind == "MOVED", slot, (host.strip("[]") or replied_from[0], port))


@dataclass(frozen=True, slots=True)
class Topology:
    """Who serves each hash slot (None: no one, the cluster is incomplete), and every node named."""

    owners: tuple[Node | None, ...]
    nodes: frozenset[Node]

    @property
    def masters(self) -> frozenset[Node]:
        return frozenset(n for n in self.owners if n is not None)


def topology(slots_reply: Any, asked: Node) -> Topology:
    """A `CLUSTER SLOTS` reply -> the Topology (pure): entries `[start, end, master, replica...]`, each
    node `[host, port, id, ...]`; an empty host means the node asked."""
    owners: list[Node | None] = [None] * SLOTS
    nodes: set[Node] = set()
    for entry in slots_reply or ():
        start, end, *served_by = entry
        found = [(_text(n[0]) or asked[0], int(n[1])) for n in served_by if len(n) >= 2]
        if not found:
            continue
        nodes.update(found)
        for slot in range(int(start), int(end) + 1):
            owners[slot] = found[0]
    return Topology(tuple(owners), frozenset(nodes))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

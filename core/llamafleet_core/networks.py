"""Which addresses a component may talk to on the word of someone else: pure checks of IP literals
against configured networks.

Two components are told where to connect by data they cannot fully trust:
- the gateway builds pod and agent URLs from the fleet membership in Redis, then forwards prompts
  there and presents the agent token (`member_networks`);
- an agent pulls a snapshot from the `source` URL its caller names, and presents its token there
  (`peer_networks`).

Both accept only an IP literal inside the configured networks. A host name is never accepted: what it
resolves to is decided later, by DNS, so a check of the name proves nothing. The default is the
private ranges pods get their addresses from (RFC 1918, the shared CGNAT range some CNIs use, IPv6
unique local); loopback and link-local (cloud metadata at 169.254.169.254) are outside it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The networks pods are addressed in on ordinary clusters (the default of both settings).
PRIVATE_NETWORKS: tuple[str, ...] = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                     "fc00::/7")
#: Loopback, for fleets whose pods all run on one host (`llamafleet up`, tests).
LOOPBACK_NETWORKS: tuple[str, ...] = ("127.0.0.0/8", "::1/128")


def split_list(value: object) -> object:
    """A comma-separated string (the environment's form) as a list; anything else unchanged."""
    if isinstance(value, str):
        return [part for part in (p.strip() for p in value.split(",")) if part]
    return value


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming the first one that is not."""
    out = []
    for item in items:
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"not an IP network: {item!r}") from exc
    return tuple(out)


def check_networks(value: list[str]) -> list[str]:
    """Settings validator: every entry parses as a network."""
    parse_networks(value)
    return value


def address_allowed(address: str, networks: Sequence[Network]) -> bool:
    """True when `address` is an IP literal inside one of `networks` (never for a host name)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in networks)


def url_host(address: str) -> str:
    """`address` as the host part of a URL: IPv6 literals in brackets."""
    return f"[{address}]" if ":" in address else address


def peer_base_url(url: str, networks: Sequence[Network]) -> str:
    """The base URL of a peer agent, rebuilt from its parts; ValueError unless `url` is exactly
    `http(s)://<IP literal in networks>:<port>` (a trailing slash allowed): no user, path, query or
    fragment, which could turn a base URL into another request than the one the agent builds."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError("not a URL") from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError("the source must be an http(s) URL")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError("the source must be a bare base URL")
    if parts.path not in ("", "/"):
        raise ValueError("the source must be a bare base URL")
    host = parts.hostname or ""
    if port is None:
        raise ValueError("the source must name a port")
    if not address_allowed(host, networks):
        raise ValueError("the source is not an address of the allowed peer networks")
    return f"{parts.scheme}://{url_host(str(ipaddress.ip_address(host)))}:{port}"

"""Which fleet members the gateway accepts: their addresses checked against `member_networks`.

The membership in Redis says where each pod is, as text. The gateway forwards client prompts to a
member's address and presents the agent token to its agent port, so whoever could write a member entry
would choose where both go (`http://collector.example:443/x?` was accepted as an "ip"). A member is
therefore accepted only when its `ip` is an IP literal inside the configured networks (the cluster's
pod networks; by default the private ranges) and its ports are real ports. Anything else is ignored:
logged once per entry (a refresh runs every second) and shown by the gauge
`llamafleet_router_members_ignored{reason}`, so a tampered or misconfigured membership is visible.

This bounds a Redis writer to addresses of the pod network; it does not tell two pods of that network
apart (NetworkPolicies and Redis credentials do).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

from prometheus_client import Gauge

from llamafleet_core.membership import Member
from llamafleet_core.networks import PRIVATE_NETWORKS, Network, address_allowed, parse_networks

log = logging.getLogger(__name__)

T = TypeVar("T")


def refusal(member: Member, networks: Sequence[Network]) -> str | None:
    """Why `member` is not accepted (`address` or `port`), or None (pure)."""
    if not address_allowed(member.ip, networks):
        return "address"
    if not all(0 < port < 65536 for port in (member.port, member.agent_port)):
        return "port"
    return None


class MemberGate:
    """Filters members by address; keeps the gauge and logs each refused entry once."""

    def __init__(self, networks: Sequence[str] | None = None) -> None:
        self._networks = parse_networks(PRIVATE_NETWORKS if networks is None else networks)
        self._gauge: Gauge | None = None
        self._logged: set[tuple[str, str, int, int]] = set()

    def show_on(self, gauge: Gauge) -> None:
        """Report the ignored members on `gauge` (`RouterMetrics.members_ignored`) from now on."""
        self._gauge = gauge
        for reason in ("address", "port"):
            gauge.labels(reason).set(0)

    def admit(self, placed: Sequence[tuple[T, Member]]) -> list[tuple[T, Member]]:
        """The entries whose member is accepted, in order; the others are logged (once) and counted."""
        out: list[tuple[T, Member]] = []
        ignored: Counter[str] = Counter()
        seen: set[tuple[str, str, int, int]] = set()
        for where, member in placed:
            reason = refusal(member, self._networks)
            if reason is None:
                out.append((where, member))
                continue
            ignored[reason] += 1
            key = (member.uid, member.ip, member.port, member.agent_port)
            seen.add(key)
            if key not in self._logged:
                log.warning("fleet member ignored: its address is not allowed", extra={
                    "member": member.name[:80], "uid": member.uid[:80], "reason": reason,
                    "address": member.ip[:120]})
        self._logged = seen
        if self._gauge is not None:
            for reason in ("address", "port"):
                self._gauge.labels(reason).set(ignored[reason])
        return out

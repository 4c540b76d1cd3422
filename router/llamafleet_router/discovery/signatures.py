"""Which fleet membership entries the gateway believes: their signatures checked (membership_signing).

With a membership key, an entry counts only when the operator signed it for the fleet whose hash holds
it: a member injected by anybody else who can write Redis, or copied from another fleet, is ignored.
Each refused entry is logged once (a refresh runs every second) and shown by the gauge
`llamafleet_router_members_ignored{reason="unsigned"|"signature"}`. Without a key entries are read as
they are (installs that sign nothing keep working).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence

from prometheus_client import Gauge

from llamafleet_core.membership import DEFAULT_PREFIX, Member, decode, fleet_id, from_fields
from llamafleet_core.membership_signing import BadSeal, Scope, unseal

log = logging.getLogger(__name__)

REASONS = ("unsigned", "signature")
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError)
Stored = tuple[str, str, Sequence[str]]  # (namespace, fleet, entries as stored)


class SignatureGate:
    """Turns a fleet's stored entries into members, dropping those whose signature is missing or wrong."""

    def __init__(self, key: bytes = b"", prefix: str = DEFAULT_PREFIX) -> None:
        self._key = key
        self._prefix = prefix
        self._gauge: Gauge | None = None
        self._logged: set[str] = set()
        self._ignored: Counter[str] = Counter()
        self._seen: set[str] = set()

    def show_on(self, gauge: Gauge) -> None:
        """Report the entries refused for their signature on `gauge` (`members_ignored`) from now on."""
        if not self._key:
            return  # nothing is checked: the gauge keeps only the address gate's reasons
        self._gauge = gauge
        for reason in REASONS:
            gauge.labels(reason).set(0)

    def members(self, fleets: Sequence[Stored]) -> list[tuple[str, str, list[Member]]]:
        """(namespace, fleet, entries) -> (namespace, fleet, accepted members ordered by name)."""
        self._ignored, self._seen = Counter(), set()
        out = [(ns, name, sorted(self._accept(ns, name, raw), key=lambda m: m.name))
               for ns, name, raw in fleets]
        self._logged = self._seen  # an entry that comes back after it left is logged again
        if self._gauge is not None:
            for reason in REASONS:
                self._gauge.labels(reason).set(self._ignored[reason])
        return out

    def _accept(self, namespace: str, fleet: str, entries: Sequence[str]) -> list[Member]:
        accepted = []
        for raw in entries:
            try:
                fields = unseal(raw, Scope(self._prefix, namespace, fleet), self._key) if self._key else None
                accepted.append(decode(raw) if fields is None else from_fields(fields))
            except BadSeal as bad:
                self._refuse(namespace, fleet, raw, bad.reason)
            except _MALFORMED:
                continue  # as without a key: a malformed entry is skipped, not fatal
        return accepted

    def _refuse(self, namespace: str, fleet: str, raw: str, reason: str) -> None:
        self._ignored[reason] += 1
        where = fleet_id(namespace, fleet)
        entry = hashlib.sha256(f"{where}\n{raw}".encode("utf-8", "surrogatepass")).hexdigest()
        self._seen.add(entry)
        if entry not in self._logged:
            log.warning("fleet member ignored: its signature is missing or wrong", extra={
                "fleet": fleet_id(namespace, fleet)[:160], "reason": reason, "entry": raw[:200]})

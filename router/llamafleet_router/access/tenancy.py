"""What one API key may see of the others: routing headers, the gateway's internals, and the prefix index.

Keys share one fleet, and the fleet's caches answer faster for a prompt someone already sent. Three
things would turn that into an oracle one key could read about the others, and each is closed here:

- the `x-llamafleet-pod`/`-slot`/`-action`/`-snapshot` headers say whether a prompt's prefix was found
  (`direct/slot_hit` versus `compute/cold`): sent only to admin keys (`admin_keys`), or to every key
  when `expose_routing_headers` says so (a single-user fleet, `llamafleet up`);
- `/metrics` and the detailed `/health` name keys, pods, slots and traffic: admin keys only on the
  client port (`api/info.py`), or anyone on the separate `metrics_port`;
- the prefix index: keys of one tenant group (`key_tenants`) hash their prompts in the group's own
  namespace (`llamafleet_core.prefix.hashing.namespaced_seed`), so a lookup never finds, and a record
  never offers, another group's prefixes. Keys in no group share the common namespace, with the
  SharedPrefix snapshots the operator warms there.

With auth off (no key configured) there is nobody to tell apart: every caller is admin, but routing
headers still need `expose_routing_headers`. Pure: parsed once from the settings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

log = logging.getLogger(__name__)


def parse_key_groups(entries: Iterable[str]) -> dict[str, str]:
    """`name:group` entries as {key name: group}; ValueError naming a malformed or repeated one."""
    groups: dict[str, str] = {}
    for text in entries:
        name, sep, group = (part.strip() for part in text.partition(":"))
        if not sep or not name or not group:
            raise ValueError(f"a key's tenant group must be `name:group`: {text!r}")
        if name in groups and groups[name] != group:
            raise ValueError(f"key {name!r} is given two tenant groups: {groups[name]!r} and {group!r}")
        groups[name] = group
    return groups


@dataclass(frozen=True, slots=True)
class Tenancy:
    """Per key name: admin or not, routing headers or not, and its prefix namespace."""

    auth_enabled: bool = False
    admin_keys: frozenset[str] = frozenset()
    expose_routing_headers: bool = False
    groups: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def build(
        cls, *, auth_enabled: bool, admin_keys: Iterable[str], expose_routing_headers: bool,
        key_tenants: Iterable[str], known_keys: Iterable[str] = (),
    ) -> Tenancy:
        admins = frozenset(admin_keys)
        groups = parse_key_groups(key_tenants)
        known = set(known_keys)
        for name in sorted((admins | groups.keys()) - known):
            if auth_enabled:  # a typo would silently leave a key without its rights or its isolation
                log.warning("a key named in admin_keys or key_tenants is not configured", extra={"key": name})
        return cls(auth_enabled, admins, expose_routing_headers, MappingProxyType(groups))

    def is_admin(self, key: str | None) -> bool:
        """May `key` (a name; None: no or a wrong key) see the gateway's internals?"""
        return not self.auth_enabled or (key is not None and key in self.admin_keys)

    def routing_headers(self, key: str) -> bool:
        """Does a response to `key` carry the `x-llamafleet-*` routing headers?"""
        return self.expose_routing_headers or (self.auth_enabled and key in self.admin_keys)

    def namespace(self, key: str) -> str:
        """The prefix-index namespace of `key`'s prompts ("" : the one every ungrouped key shares)."""
        return self.groups.get(key, "")

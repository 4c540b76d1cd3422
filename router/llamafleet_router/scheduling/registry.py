"""Plugin registry: a plain dict from plugin type to its `PluginSpec`.

Filled explicitly by `register_builtin_plugins()`; importing a plugin module registers nothing (no
import side effects, no entry points), so tests and apps build exactly the registry they want, and a
third party adds a plugin by putting its own `PluginSpec` into the dict before loading the config.
"""

from __future__ import annotations

from llamafleet_router.scheduling.framework import PluginSpec
from llamafleet_router.scheduling.plugins.filters import bounded_load, has_idle_slot, healthy, model
from llamafleet_router.scheduling.plugins.pickers import max_score
from llamafleet_router.scheduling.plugins.producers import prefix_lookup
from llamafleet_router.scheduling.plugins.scorers import (
    degraded_hash,
    free_slots,
    prefix_match,
    queue_depth,
    session_affinity,
    snapshot_match,
)

Registry = dict[str, PluginSpec]

BUILTIN_SPECS: tuple[PluginSpec, ...] = (
    prefix_lookup.SPEC,
    healthy.SPEC,
    model.SPEC,
    has_idle_slot.SPEC,
    bounded_load.SPEC,
    prefix_match.SPEC,
    snapshot_match.SPEC,
    free_slots.SPEC,
    queue_depth.SPEC,
    session_affinity.SPEC,
    degraded_hash.SPEC,
    max_score.SPEC,
)


def register(registry: Registry, spec: PluginSpec) -> None:
    """Add one plugin type; a type registered twice is a programming error."""
    if spec.type_name in registry:
        raise ValueError(f"plugin type {spec.type_name!r} is already registered")
    registry[spec.type_name] = spec


def register_builtin_plugins(registry: Registry | None = None) -> Registry:
    """Put every built-in plugin type into `registry` (a new dict if None) and return it."""
    out: Registry = {} if registry is None else registry
    for spec in BUILTIN_SPECS:
        register(out, spec)
    return out

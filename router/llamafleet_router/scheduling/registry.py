"""Plugin registry: a plain dict from plugin type to its `PluginSpec`.

Filled explicitly by `register_builtin_plugins()`; importing a plugin module registers nothing (no
import side effects, no entry points), so tests and apps build exactly the registry they want, and a
third party adds a plugin by putting its own `PluginSpec` into the dict before loading the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llamafleet_router.scheduling.framework import (
    DecisionHook,
    Filter,
    Picker,
    PluginHandle,
    PluginSpec,
    Producer,
    Scorer,
)
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

if TYPE_CHECKING:  # config.py validates against a registry: a run-time import would be circular
    from llamafleet_router.scheduling.config import PipelineConfig

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


@dataclass
class Plugins:
    """A profile's plugins, built and sorted by kind, in the config's order."""

    producers: list[Producer] = field(default_factory=list)
    filters: list[Filter] = field(default_factory=list)
    scorers: list[tuple[Scorer, float]] = field(default_factory=list)
    pickers: list[Picker] = field(default_factory=list)
    hooks: list[DecisionHook] = field(default_factory=list)  # plugins that learn from decisions
    produces: dict[str, tuple[str, ...]] = field(default_factory=dict)  # producer name -> its state keys

    @property
    def picker(self) -> Picker:
        return self.pickers[0]  # the config guarantees exactly one


def build_plugins(config: PipelineConfig, registry: Registry, handle: PluginHandle) -> Plugins:
    """Build every plugin of the config's profile from `registry`."""
    out = Plugins()
    for entry in config.profile.plugins:
        pc = config.plugin(entry.ref)
        spec = registry[pc.type]
        plugin = spec.factory(pc.ref_name, pc.params, handle)
        out.produces[pc.ref_name] = spec.produces
        # Dispatch on the kind the registry declares (what the config was validated against), and
        # check the built object really implements it.
        if spec.kind == "producer" and isinstance(plugin, Producer):
            out.producers.append(plugin)
        elif spec.kind == "filter" and isinstance(plugin, Filter):
            out.filters.append(plugin)
        elif spec.kind == "scorer" and isinstance(plugin, Scorer):
            out.scorers.append((plugin, float(entry.weight or 0.0)))
        elif spec.kind == "picker" and isinstance(plugin, Picker):
            out.pickers.append(plugin)
        else:
            raise TypeError(f"plugin {pc.ref_name!r} does not implement the {spec.kind} protocol")
        if isinstance(plugin, DecisionHook):
            out.hooks.append(plugin)
    return out

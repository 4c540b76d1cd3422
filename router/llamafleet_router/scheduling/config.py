"""Scheduling config: plugin instances listed once, then referenced by the profile with weights.

    plugins:
      - {type: prefix-lookup}
      - {type: healthy}
      - {type: prefix-match, name: prefix}
      - {type: max-score}
    profile:
      plugins:
        - {ref: prefix-lookup}
        - {ref: healthy}
        - {ref: prefix, weight: 10}
        - {ref: max-score}
    decision: {restore_enabled: true, prefill_tokens_per_s: 2000}   # costs.ActionCosts
    leases: {ttl_s: 300, max_attempts: 8}

A plugin's `name` defaults to its `type`. Producers and filters run in profile order. Validation happens
at load time against a registry (the built-ins unless one is passed as validation context): an unknown
type, bad params, a scorer without a weight, a weight on a non-scorer, zero or two pickers, a ref to an
unknown name, or a consumed CycleState key that no producer in the profile writes, is a
`pydantic.ValidationError`. Read once at startup; hot reload is not a goal.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.scheduling.registry import Registry, register_builtin_plugins

__all__ = ["PipelineConfig", "ValidationError", "default_config", "load_config", "load_config_file"]


class PluginConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref_name(self) -> str:
        return self.name or self.type


class ProfileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str
    weight: float | None = Field(default=None, ge=0)


class ProfileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plugins: list[ProfileEntry]


class LeaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float = Field(default=300.0, gt=0)  # outlives any sane request; release() normally ends it
    max_attempts: int = Field(default=8, ge=1)  # bounds lease round trips per request


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plugins: list[PluginConfig]
    profile: ProfileConfig
    decision: ActionCosts = Field(default_factory=ActionCosts)
    leases: LeaseConfig = Field(default_factory=LeaseConfig)

    def plugin(self, ref: str) -> PluginConfig:
        return next(p for p in self.plugins if p.ref_name == ref)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> PipelineConfig:
        context = info.context if isinstance(info.context, Mapping) else {}
        registry: Registry = context.get("registry") or register_builtin_plugins()
        problems = _problems(self, registry)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _problems(cfg: PipelineConfig, registry: Registry) -> list[str]:
    problems: list[str] = []
    by_name: dict[str, PluginConfig] = {}
    for p in cfg.plugins:
        if p.ref_name in by_name:
            problems.append(f"duplicate plugin name {p.ref_name!r}")
        by_name[p.ref_name] = p
        spec = registry.get(p.type)
        if spec is None:
            problems.append(f"unknown plugin type {p.type!r} (known: {', '.join(sorted(registry))})")
            continue
        try:
            spec.params.model_validate(p.params)
        except ValidationError as exc:
            problems.append(f"bad params for {p.ref_name!r}: {exc.errors(include_url=False)}")
    pickers, produced, consumed, seen = 0, set[str](), set[str](), set[str]()
    for entry in cfg.profile.plugins:
        if entry.ref in seen:
            problems.append(f"profile references {entry.ref!r} twice")
        seen.add(entry.ref)
        plugin = by_name.get(entry.ref)
        if plugin is None:
            problems.append(f"profile references unknown plugin name {entry.ref!r}")
            continue
        spec = registry.get(plugin.type)
        if spec is None:
            continue
        if spec.kind == "scorer" and entry.weight is None:
            problems.append(f"scorer {entry.ref!r} needs a weight")
        if spec.kind != "scorer" and entry.weight is not None:
            problems.append(f"{spec.kind} {entry.ref!r} takes no weight")
        pickers += spec.kind == "picker"
        produced.update(spec.produces)
        consumed.update(spec.consumes)
    if pickers != 1:
        problems.append(f"the profile needs exactly one picker, found {pickers}")
    for key in sorted(consumed - produced):
        problems.append(f"no producer in the profile writes {key!r}, which a plugin consumes")
    return problems


def load_config(data: Mapping[str, Any] | str, registry: Registry | None = None) -> PipelineConfig:
    """Validate a config given as a dict or as YAML text."""
    raw = yaml.safe_load(data) if isinstance(data, str) else data
    if not isinstance(raw, Mapping):
        raise ValueError("scheduling config must be a mapping")
    return PipelineConfig.model_validate(raw, context={"registry": registry or register_builtin_plugins()})


def load_config_file(path: Path, registry: Registry | None = None) -> PipelineConfig:
    return load_config(path.read_text(encoding="utf-8"), registry)


# Weights: a full prefix hit (10) beats anything else combined; a full local restore (8 * 0.9) beats
# a cold pod's load signal (free-slots + queue-depth <= 2); session affinity (5) beats the degraded
# hash (4) so that, with Redis down, a conversation goes back to the slot holding all of it; the
# degraded hash beats the load signal so replicas agree on a pod per prefix.
DEFAULT_CONFIG: dict[str, Any] = {
    "plugins": [
        {"type": "prefix-lookup"},
        {"type": "healthy"},
        {"type": "model"},
        {"type": "has-idle-slot"},
        {"type": "bounded-load", "params": {"load_factor": 1.25}},
        {"type": "prefix-match"},
        {"type": "snapshot-match"},
        {"type": "session-affinity"},
        {"type": "degraded-hash"},
        {"type": "free-slots"},
        {"type": "queue-depth"},
        {"type": "max-score"},
    ],
    "profile": {
        "plugins": [
            {"ref": "prefix-lookup"},
            {"ref": "healthy"},
            {"ref": "model"},
            {"ref": "has-idle-slot"},
            {"ref": "bounded-load"},
            {"ref": "prefix-match", "weight": 10},
            {"ref": "snapshot-match", "weight": 8},
            {"ref": "session-affinity", "weight": 5},
            {"ref": "degraded-hash", "weight": 4},
            {"ref": "free-slots", "weight": 1},
            {"ref": "queue-depth", "weight": 1},
            {"ref": "max-score"},
        ]
    },
}


def default_config() -> PipelineConfig:
    return load_config(DEFAULT_CONFIG)

"""Which fleet serves a model name: a name two fleets claim is refused, unless `model_fleets` says which.

Clients name a model; each pod reports the model it serves (its alias, the fleet's `spec.model.name`).
With membership discovery one gateway serves many fleets, from many namespaces, and anybody who may
create a LlamaFleet chooses its model name. Pooling every pod that reports a name would hand one team's
prompts to another team's pods. So a model name resolves to exactly one fleet (`namespace/name`):

- the fleet `model_fleets` maps it to (`model=namespace/name`), whatever else claims the name;
- else the only fleet whose pods report it;
- else (two fleets or more, no mapping) nobody: every request for it gets a 503 `model_conflict` that
  names the fleets, `/health` lists the conflict, and `llamafleet_router_model_conflicts` counts it.

A pod that reports no fleet (static discovery) belongs to the one unnamed fleet. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from llamafleet_core.model_fleets import parse_model_fleets
from llamafleet_router.errors import UNAVAILABLE, ApiError

if TYPE_CHECKING:  # settings.py parses `model_fleets` here, and discovery imports settings
    from llamafleet_router.discovery.base import PodStatus

_UNNAMED = "(static pods)"
__all__ = ["ModelOwners", "model_conflict", "parse_model_fleets"]


def model_conflict(model: str, fleets: Sequence[str]) -> ApiError:
    return ApiError(
        503, f"The model `{model}` is served by several fleets ({', '.join(fleets)}); the gateway routes "
             "it to none of them until its `model_fleets` setting names the one that serves it.",
        type=UNAVAILABLE, code="model_conflict", param="model",
    )


def _fleet(pod: PodStatus) -> str:
    return pod.fleet or _UNNAMED


@dataclass(frozen=True, slots=True)
class ModelOwners:
    """The configured `model_fleets` and the rules above."""

    mapping: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> ModelOwners:
        return cls(MappingProxyType(parse_model_fleets(entries)))

    def conflicts(self, pods: Sequence[PodStatus]) -> dict[str, list[str]]:
        """{model: its fleets, sorted} for every model name claimed by two fleets or more and not mapped."""
        claims: dict[str, set[str]] = {}
        for pod in pods:
            if pod.model and pod.model not in self.mapping:
                claims.setdefault(pod.model, set()).add(_fleet(pod))
        return {model: sorted(fleets) for model, fleets in sorted(claims.items()) if len(fleets) > 1}

    def pick(self, model: str, pods: list[PodStatus]) -> list[PodStatus]:
        """`pods` without those that report `model` for a fleet other than its owner (the scheduler
        filters by model itself). Raises `model_conflict` for a name two fleets claim, unmapped."""
        owner = self.mapping.get(model)
        if owner is None:
            fleets = {_fleet(pod) for pod in pods if pod.model == model}
            if len(fleets) > 1:
                raise model_conflict(model, sorted(fleets))
            return pods  # one fleet (or none yet) reports it: nothing to take away
        return [pod for pod in pods if pod.model != model or _fleet(pod) == owner]

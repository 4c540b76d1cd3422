"""Pure renderers: a LlamaFleet (plus a `Target`) in, Kubernetes manifests (dicts) out. No I/O, no kopf."""

from __future__ import annotations

from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render.common import Manifest, Target, owner_reference
from llamafleet_operator.render.policy import render_network_policy, render_pdb
from llamafleet_operator.render.service import fleet_config, render_config_map, render_service
from llamafleet_operator.render.workload import render_workload


def render_all(fleet: LlamaFleet, target: Target) -> list[Manifest]:
    """Every child object of a fleet, in apply order (config before the pods that mount it)."""
    return [
        render_config_map(fleet, target),
        render_service(fleet, target),
        render_workload(fleet, target),
        render_pdb(fleet, target),
        render_network_policy(fleet, target),
    ]


__all__ = [
    "Manifest", "Target", "fleet_config", "owner_reference", "render_all", "render_config_map",
    "render_network_policy", "render_pdb", "render_service", "render_workload",
]

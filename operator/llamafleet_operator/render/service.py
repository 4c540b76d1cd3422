"""The headless Service and the fleet ConfigMap.

Headless, because clients never balance over the pods through it: the gateway picks a pod (and a slot)
itself. The Service gives every pod a DNS name and publishes pods that are not ready yet, since a new
pod's agent must pull snapshots from its peers before it turns ready.
"""

from __future__ import annotations

import json

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render.common import Manifest, Target, metadata


def render_service(fleet: LlamaFleet, target: Target) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(target),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": L.fleet_labels(target.name),
            "ports": [
                {"name": "http", "port": podspec.SERVER_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "agent", "port": podspec.AGENT_PORT, "targetPort": "agent", "protocol": "TCP"},
            ],
        },
    }


def fleet_config(fleet: LlamaFleet, target: Target) -> dict[str, object]:
    """What the agent and the gateway read about the fleet: the model and the KV layout snapshots need."""
    spec = target.spec_of(fleet)
    return {
        "fleet": target.name,
        "namespace": target.namespace,
        "model": {"name": spec.model.name, "file": spec.model.file, "sha256": spec.model.sha256},
        "slots": spec.slots,
        "contextPerSlot": spec.context_per_slot,
        "kv": podspec.kv_settings(spec),
        "attach": target.attach(spec),
        "cachePrefix": target.cache_prefix(spec),
        "ports": {"server": podspec.SERVER_PORT, "agent": podspec.AGENT_PORT},
        "snapshotBudgetBytes": podspec.snapshot_budget_bytes(spec),
    }


def render_config_map(fleet: LlamaFleet, target: Target) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(target, target.config_map),
        "data": {"fleet.json": json.dumps(fleet_config(fleet, target), indent=2, sort_keys=True) + "\n"},
    }

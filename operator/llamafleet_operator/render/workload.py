"""The llama-server workload: a Deployment (default) or a StatefulSet, per `spec.workload`.

Deployment: rolls one extra pod at a time and never drops below the desired count (maxUnavailable 0), since
a pod that leaves takes its warm slots with it. StatefulSet: pods start in parallel (they share nothing
at start-up), and `snapshots.storage: pvc` without `pvcName` gets a claim per pod that survives restarts.
"""

from __future__ import annotations

from llamafleet_core import labels as L
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render.common import Manifest, Target, metadata
from llamafleet_operator.render.pod import pod_template


def render_workload(fleet: LlamaFleet, target: Target) -> Manifest:
    spec = target.spec_of(fleet)
    body: Manifest = {
        "replicas": spec.replicas,
        "selector": {"matchLabels": L.fleet_labels(target.name)},
    }
    if spec.workload == "StatefulSet":
        body.update({
            "serviceName": target.name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
        })
        snaps = spec.snapshots
        if snaps.storage == "pvc" and snaps.pvc_name is None:
            claim: Manifest = {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": str(snaps.size_limit)}},
            }
            if snaps.storage_class:
                claim["storageClassName"] = snaps.storage_class
            body["volumeClaimTemplates"] = [{
                "metadata": {"name": "snapshots", "labels": L.common_labels(target.name)},
                "spec": claim,
            }]
    else:
        body["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    body["template"] = pod_template(fleet, target)
    return {
        "apiVersion": "apps/v1",
        "kind": spec.workload,
        "metadata": metadata(target),
        "spec": body,
    }


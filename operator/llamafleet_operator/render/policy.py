"""PodDisruptionBudget and NetworkPolicy of a fleet.

PDB: at most one pod voluntarily evicted at a time (each pod holds warm slots that take time to rebuild),
but pods that are not ready anyway may always be evicted, so a broken pod never blocks a node drain.

NetworkPolicy: llama-server's admin endpoints (`/slots` save/restore/erase) and the agent must never be
reachable by clients (DESIGN.md section 5). Ingress to both ports is admitted only from the gateway and
the operator, and to the agent port from peer pods of the same fleet (snapshot pulls).
"""

from __future__ import annotations

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render.common import Manifest, Target, metadata


def render_pdb(fleet: LlamaFleet, target: Target) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(target),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": L.fleet_labels(target.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _peer(component: L.Component, namespace: str | None, target: Target) -> Manifest:
    peer: Manifest = {"podSelector": {"matchLabels": {
        L.COMPONENT: component.value, L.APP_PART_OF: L.PART_OF}}}
    if namespace is not None and namespace != target.namespace:
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return peer


def render_network_policy(fleet: LlamaFleet, target: Target) -> Manifest:
    server = {"protocol": "TCP", "port": podspec.SERVER_PORT}
    agent = {"protocol": "TCP", "port": podspec.AGENT_PORT}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(target),
        "spec": {
            "podSelector": {"matchLabels": L.fleet_labels(target.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        _peer(L.Component.GATEWAY, target.gateway_namespace, target),
                        _peer(L.Component.OPERATOR, target.operator_namespace, target),
                    ],
                    "ports": [server, agent],
                },
                {
                    "from": [{"podSelector": {"matchLabels": L.fleet_labels(target.name)}}],
                    "ports": [agent],
                },
            ],
        },
    }

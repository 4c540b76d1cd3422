"""PodDisruptionBudget and NetworkPolicy of a fleet.

PDB: at most one pod voluntarily evicted at a time (each pod holds warm slots that take time to rebuild),
but pods that are not ready anyway may always be evicted, so a broken pod never blocks a node drain.

NetworkPolicy: llama-server's admin endpoints (`/slots` save/restore/erase) and the agent must never be
reachable by clients (DESIGN.md section 5). Ingress to both ports is admitted only from the gateway and
the operator, and to the agent port from peer pods of the same fleet (snapshot pulls) and from the
Prometheus pods the operator is told of (`metrics_peers`: the agents' /metrics; llama-server's own
/metrics on its port only with `metrics_server`, since no policy can admit one path of a port).
Every peer names its namespace explicitly. Inside a namespace admission is still by labels: whoever may
create pods in the fleet's namespace (or the gateway's) can label one as a gateway or a peer.

Egress (the pods run images the fleet's author chose and parse hostile prompts): DNS, the agent port of
the same fleet's pods (pulls), and, only for a model downloaded from a URL, that URL's port anywhere but
link-local addresses (cloud metadata services). Nothing else: not Redis, not the API server, not other
fleets.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render.common import Manifest, Target, metadata

NAMESPACE_NAME = "kubernetes.io/metadata.name"  # the API server sets it on every namespace


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


def _in_namespace(namespace: str) -> Manifest:
    return {"matchLabels": {NAMESPACE_NAME: namespace}}


def _peer(component: L.Component, namespace: str | None, target: Target) -> Manifest:
    return {"podSelector": {"matchLabels": {L.COMPONENT: component.value, L.APP_PART_OF: L.PART_OF}},
            "namespaceSelector": _in_namespace(namespace or target.namespace)}


def _fleet_peers(target: Target) -> Manifest:
    return {"podSelector": {"matchLabels": L.fleet_labels(target.name)},
            "namespaceSelector": _in_namespace(target.namespace)}


def _download_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (80 if parts.scheme == "http" else 443)


def _egress(fleet: LlamaFleet, target: Target) -> list[Manifest]:
    rules: list[Manifest] = [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [_fleet_peers(target)], "ports": [{"protocol": "TCP", "port": podspec.AGENT_PORT}]},
    ]
    url = fleet.spec.model.source.url
    if url is not None:
        rules.append({
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
                   {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}],
            "ports": [{"protocol": "TCP", "port": _download_port(url)}],
        })
    return rules


def _metrics_ingress(target: Target) -> list[Manifest]:
    if not target.metrics_peers:
        return []
    ports = [{"protocol": "TCP", "port": podspec.AGENT_PORT}]
    if target.metrics_server:
        ports.append({"protocol": "TCP", "port": podspec.SERVER_PORT})
    return [{"from": [dict(p) for p in target.metrics_peers], "ports": ports}]


def render_network_policy(fleet: LlamaFleet, target: Target) -> Manifest:
    server = {"protocol": "TCP", "port": podspec.SERVER_PORT}
    agent = {"protocol": "TCP", "port": podspec.AGENT_PORT}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(target),
        "spec": {
            "podSelector": {"matchLabels": L.fleet_labels(target.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        _peer(L.Component.GATEWAY, target.gateway_namespace, target),
                        _peer(L.Component.OPERATOR, target.operator_namespace, target),
                    ],
                    "ports": [server, agent],
                },
                {
                    "from": [_fleet_peers(target)],
                    "ports": [agent],
                },
                *_metrics_ingress(target),
            ],
            "egress": _egress(fleet, target),
        },
    }

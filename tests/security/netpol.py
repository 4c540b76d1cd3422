"""Kubernetes NetworkPolicy semantics (ingress, and egress at the end), as pure functions, for checking
rendered policies.

What the API server documents (networking.k8s.io/v1), for one policy alone in its namespace:

- a policy isolates the pods its `podSelector` selects, for ingress when `policyTypes` names Ingress
  (or is unset: Ingress is then always implied); pods it does not isolate accept all traffic;
- an isolated pod accepts what some rule of `ingress` admits: a missing or empty `ingress` admits nothing;
- a rule admits a connection when one of its `ports` matches (missing or empty `ports`: every port) and
  one of its `from` peers matches the source (missing or empty `from`: every source, in the cluster or
  not);
- a peer with a podSelector only selects pods of the policy's namespace; with a namespaceSelector only,
  every pod of the selected namespaces; with both, the selected pods of the selected namespaces (AND);
  separate peers are OR'ed. `{}` selects everything;
- label selectors AND their `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist;
  NotIn and DoesNotExist also match pods without the key);
- an `ipBlock` peer is taken to admit every source: pod IPs are not known here, and a CIDR that covers
  them would admit the pods whatever their labels. The renderers never use one, so a policy with one
  fails the checks instead of passing on a guess.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class Source:
    """Who connects: a pod (labels, namespace and that namespace's labels) or, with `namespace=None`, a
    client outside the cluster."""

    name: str
    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def all_namespace_labels(self) -> dict[str, str]:
        assert self.namespace is not None
        return {**self.namespace_labels, NAMESPACE_NAME: self.namespace}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector against a label set: every matchLabels pair and every expression must hold."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        # What the API server's validation demands; a malformed selector must fail, not match by luck.
        assert bool(values) == (op in ("In", "NotIn")), f"invalid expression {expr}"
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise AssertionError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def peer_admits(peer: dict[str, Any], policy_namespace: str, source: Source) -> bool:
    if "ipBlock" in peer:
        return True
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    assert pods is not None or namespaces is not None, f"a peer selects nothing: {peer}"
    if source.namespace is None:  # selectors only ever select pods
        return False
    in_namespace = (source.namespace == policy_namespace if namespaces is None
                    else selects(namespaces, source.all_namespace_labels()))
    return in_namespace and (pods is None or selects(pods, source.labels))


def port_admits(rule_port: dict[str, Any], port: int, protocol: str = "TCP") -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    number = rule_port.get("port")
    if number is None or isinstance(number, str):
        # No port: all of the protocol's. A named port resolves to whatever container port carries the
        # name; without the pod spec, assume the one asked (the renderers use numbers).
        return True
    return bool(number <= port <= rule_port.get("endPort", number))


def isolates_ingress(spec: dict[str, Any]) -> bool:
    types = spec.get("policyTypes")
    return types is None or "Ingress" in types


def admits(policy: dict[str, Any], pod_labels: dict[str, str], source: Source, port: int) -> bool:
    """Whether `source` may open a TCP connection to `port` of a pod labelled `pod_labels` in the
    policy's namespace, when `policy` is the only NetworkPolicy there."""
    spec, namespace = policy["spec"], policy["metadata"]["namespace"]
    if not selects(spec["podSelector"], pod_labels) or not isolates_ingress(spec):
        return True
    for rule in spec.get("ingress") or []:
        ports, peers = rule.get("ports") or [], rule.get("from") or []
        if ports and not any(port_admits(p, port) for p in ports):
            continue
        if not peers or any(peer_admits(peer, namespace, source) for peer in peers):
            return True
    return False


# --- egress ---------------------------------------------------------------------------------------------
#
# For one policy alone, from the API server's documentation: a policy isolates its pods for egress when
# `policyTypes` names Egress (unset: when the policy has an `egress` section); an isolated pod may open
# what some rule of `egress` admits, and nothing else (a missing or empty `egress` admits nothing). A rule
# admits a connection when one of its `ports` matches (none: every port) and one of its `to` peers
# matches the destination (none: every destination). An `ipBlock` peer matches an address inside `cidr`
# and outside every `except` (pods have addresses too: a broad block matches them whatever their
# labels); selectors match pods as for ingress and never an address outside the cluster.

@dataclass(frozen=True)
class Destination:
    """Where a connection goes: a pod (namespace, labels, its address) or, with `namespace=None`, an
    address outside the cluster's pods (the API server's, a metadata service, the internet)."""

    name: str
    namespace: str | None
    ip: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def as_source(self) -> Source:
        return Source(self.name, self.namespace, self.labels, self.namespace_labels)


def isolates_egress(spec: dict[str, Any]) -> bool:
    types = spec.get("policyTypes")
    return "Egress" in types if types is not None else "egress" in spec


def in_block(ip: str, block: dict[str, Any]) -> bool:
    address = ipaddress.ip_address(ip)
    net = ipaddress.ip_network(block["cidr"])
    if address.version != net.version or address not in net:
        return False
    return not any(address in ipaddress.ip_network(e) for e in block.get("except") or []
                   if ipaddress.ip_network(e).version == address.version)


def egress_peer_admits(peer: dict[str, Any], policy_namespace: str, dest: Destination) -> bool:
    if "ipBlock" in peer:
        return in_block(dest.ip, peer["ipBlock"])
    return peer_admits(peer, policy_namespace, dest.as_source())


def admits_egress(policy: dict[str, Any], pod_labels: dict[str, str], dest: Destination, port: int,
                  protocol: str = "TCP") -> bool:
    """Whether a pod labelled `pod_labels` in the policy's namespace may connect to `dest` on `port`,
    when `policy` is the only NetworkPolicy there."""
    spec, namespace = policy["spec"], policy["metadata"]["namespace"]
    if not selects(spec["podSelector"], pod_labels) or not isolates_egress(spec):
        return True
    for rule in spec.get("egress") or []:
        ports, peers = rule.get("ports") or [], rule.get("to") or []
        if ports and not any(port_admits(p, port, protocol) for p in ports):
            continue
        if not peers or any(egress_peer_admits(peer, namespace, dest) for peer in peers):
            return True
    return False

"""The rendered NetworkPolicy, evaluated the way Kubernetes does, for every kind of pod that might try:
llama-server's port is reachable only from the gateway and the operator; the agent's port also from
the fleet's own pods (peer pulls); nobody else reaches either, in any namespace layout.

The evaluator is the NetworkPolicy ingress semantics reduced to what the renderer uses: rules are OR'ed,
a rule admits a source matched by any of its `from` peers on any of its ports; a peer with only a
podSelector selects pods of the policy's namespace, with a namespaceSelector pods of those namespaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import render_all
from llamafleet_operator.render.common import Target

SPECS = Path(__file__).parents[1] / "operator" / "specs"
NS = "team"


@dataclass(frozen=True)
class Source:
    name: str
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admits(policy: dict[str, Any], source: Source, port: int) -> bool:
    spec = policy["spec"]
    assert "Ingress" in spec["policyTypes"]
    for rule in spec.get("ingress") or []:
        if not any(p["port"] == port for p in rule.get("ports") or []):
            continue
        for peer in rule.get("from") or []:
            ns_sel = peer.get("namespaceSelector")
            ns_ok = (source.namespace == policy["metadata"]["namespace"] if ns_sel is None
                     else _matches(ns_sel, {"kubernetes.io/metadata.name": source.namespace}))
            if ns_ok and _matches(peer.get("podSelector") or {}, source.labels):
                return True
    return False


def component(c: L.Component, ns: str) -> dict[str, str]:
    return {L.COMPONENT: c.value, L.APP_PART_OF: L.PART_OF, "app.kubernetes.io/name": "x", "ns": ns}


def sources(fleet: str, gateway_ns: str, operator_ns: str) -> dict[str, tuple[Source, bool, bool]]:
    """name -> (source, may reach llama-server, may reach the agent)."""
    return {
        "gateway": (Source("gw", gateway_ns, component(L.Component.GATEWAY, gateway_ns)), True, True),
        "operator": (Source("op", operator_ns, component(L.Component.OPERATOR, operator_ns)), True, True),
        "peer pod": (Source("peer", NS, {**L.fleet_labels(fleet), L.APP_PART_OF: L.PART_OF}), False, True),
        "other fleet's pod": (Source("other", NS, L.fleet_labels(fleet + "-other")), False, False),
        "client pod": (Source("client", NS, {"app": "agent-client"}), False, False),
        "gateway label, other namespace": (
            Source("gw-elsewhere", "elsewhere", component(L.Component.GATEWAY, "elsewhere")), False, False),
        "operator label, other namespace": (
            Source("op-elsewhere", "elsewhere", component(L.Component.OPERATOR, "elsewhere")), False, False),
        "gateway label without part-of": (
            Source("fake-gw", gateway_ns, {L.COMPONENT: L.Component.GATEWAY.value}), False, False),
        "peer labels, other namespace": (
            Source("peer-elsewhere", "elsewhere", L.fleet_labels(fleet)), False, False),
    }


@pytest.mark.parametrize("spec", sorted(p.stem for p in SPECS.glob("*.yaml")))
@pytest.mark.parametrize(("gateway_ns", "operator_ns"), [(None, None), (None, "llamafleet-system"),
                                                        ("gateways", "llamafleet-system")])
def test_only_gateway_operator_and_peer_agents_reach_the_pods(
    spec: str, gateway_ns: str | None, operator_ns: str | None,
) -> None:
    doc = yaml.safe_load((SPECS / f"{spec}.yaml").read_text())
    doc.setdefault("metadata", {})["namespace"] = NS
    fleet = LlamaFleet.model_validate(doc)
    target = Target.of(fleet, gateway_namespace=gateway_ns, operator_namespace=operator_ns)
    policies = [o for o in render_all(fleet, target) if o["kind"] == "NetworkPolicy"]
    assert len(policies) == 1
    policy = policies[0]
    assert policy["metadata"]["namespace"] == NS
    assert _matches(policy["spec"]["podSelector"], L.fleet_labels(target.name))
    cases = sources(target.name, gateway_ns or NS, operator_ns or NS)
    for name, (source, server_ok, agent_ok) in cases.items():
        assert admits(policy, source, podspec.SERVER_PORT) is server_ok, (name, "llama-server")
        assert admits(policy, source, podspec.AGENT_PORT) is agent_ok, (name, "agent")
        assert not admits(policy, source, 9999), (name, "a port nobody listens on")

"""The rendered NetworkPolicies, evaluated the way Kubernetes does (netpol.py), for every kind of source
that might try:

- a fleet's policy (operator): llama-server's port is reachable only from the gateway and the operator;
  the agent's port also from the fleet's own pods (peer pulls); nobody else reaches either, in any
  namespace layout, nor any other port;
- the chart's: Redis only from the release's gateway and operator, the operator from nobody, the gateway
  from anyone but on its HTTP port only;
- egress: fleet pods reach DNS, their peers' agent port and (a fleet that downloads its model) that
  URL's port outside link-local addresses, nothing else; the chart's pods what each needs.

The check can fail: doctored copies of a fleet's policy that a careless edit could produce (an allow-all
rule, a rule without `from` or `ports`, a broad namespaceSelector, selectors OR'ed instead of AND'ed,
loose expressions, an ipBlock, no Ingress isolation) must each be caught.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import render_all
from llamafleet_operator.render.common import Target
from llamafleet_testbed import helm
from tests.security.netpol import NAMESPACE_NAME, Destination, Source, admits, admits_egress, selects

ROOT = Path(__file__).parents[2]
SPECS = ROOT / "tests" / "operator" / "specs"
NS = "team"
OTHER_PORT = 9999
LAYOUTS = [(None, None), (None, "llamafleet-system"), ("gateways", "llamafleet-system")]
Manifest = dict[str, Any]


def component(c: L.Component) -> dict[str, str]:
    return {L.COMPONENT: c.value, L.APP_PART_OF: L.PART_OF, "app.kubernetes.io/name": "x"}


def sources(pod: dict[str, str], gateway_ns: str, operator_ns: str) -> dict[str, tuple[Source, bool, bool]]:
    """name -> (source, may reach llama-server, may reach the agent); `pod`: the fleet's pod labels."""
    other_fleet = {**pod, L.FLEET: pod[L.FLEET] + "-other", L.APP_INSTANCE: pod[L.FLEET] + "-other"}
    return {
        "gateway": (Source("gw", gateway_ns, component(L.Component.GATEWAY)), True, True),
        "operator": (Source("op", operator_ns, component(L.Component.OPERATOR)), True, True),
        "peer pod": (Source("peer", NS, pod), False, True),
        "other fleet's pod": (Source("other", NS, other_fleet), False, False),
        "client pod": (Source("client", NS, {"app": "agent-client"}), False, False),
        "client pod, gateway namespace": (Source("c-gw", gateway_ns, {"app": "c"}), False, False),
        "client pod, operator namespace": (Source("c-op", operator_ns, {"app": "c"}), False, False),
        "gateway label, other namespace": (
            Source("gw-elsewhere", "elsewhere", component(L.Component.GATEWAY)), False, False),
        "operator label, other namespace": (
            Source("op-elsewhere", "elsewhere", component(L.Component.OPERATOR)), False, False),
        "gateway label without part-of": (
            Source("fake-gw", gateway_ns, {L.COMPONENT: L.Component.GATEWAY.value}), False, False),
        "peer labels, other namespace": (Source("peer-elsewhere", "elsewhere", pod), False, False),
        "outside the cluster": (Source("internet", None), False, False),
    }


def violations(policy: Manifest, pod: dict[str, str], gateway_ns: str, operator_ns: str) -> list[str]:
    found = []
    for name, (source, server_ok, agent_ok) in sources(pod, gateway_ns, operator_ns).items():
        wants = ((podspec.SERVER_PORT, server_ok), (podspec.AGENT_PORT, agent_ok), (OTHER_PORT, False))
        for port, want in wants:
            if admits(policy, pod, source, port) is not want:
                found.append(f"{name} {'refused' if want else 'admitted'} on {port}")
    return found


def rendered(spec: str, gateway_ns: str | None, operator_ns: str | None) -> tuple[Manifest, dict[str, str]]:
    """The fleet's one NetworkPolicy and the labels of the pods it protects (from the rendered workload)."""
    doc = yaml.safe_load((SPECS / f"{spec}.yaml").read_text())
    doc.setdefault("metadata", {})["namespace"] = NS
    fleet = LlamaFleet.model_validate(doc)
    objs = render_all(fleet, Target.of(fleet, gateway_namespace=gateway_ns, operator_namespace=operator_ns))
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    (workload,) = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    assert policy["metadata"]["namespace"] == NS
    return policy, workload["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("spec", sorted(p.stem for p in SPECS.glob("*.yaml")))
@pytest.mark.parametrize(("gateway_ns", "operator_ns"), LAYOUTS)
def test_only_gateway_operator_and_peer_agents_reach_the_pods(
    spec: str, gateway_ns: str | None, operator_ns: str | None,
) -> None:
    policy, pod = rendered(spec, gateway_ns, operator_ns)
    assert selects(policy["spec"]["podSelector"], pod)
    assert violations(policy, pod, gateway_ns or NS, operator_ns or NS) == []


def _split_gateway_peer(spec: Manifest, gateway_ns: str) -> None:
    peer = spec["ingress"][0]["from"][0]
    peer.pop("namespaceSelector", None)
    spec["ingress"][0]["from"].append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: gateway_ns}}})


DOCTORED: dict[str, Callable[[Manifest, str], None]] = {
    "an allow-all rule": lambda s, _: s["ingress"].append({}),
    "a rule without from": lambda s, _: s["ingress"][0].pop("from"),
    "a rule with an empty from": lambda s, _: s["ingress"][0].update({"from": []}),
    "a rule without ports": lambda s, _: s["ingress"][1].pop("ports"),
    "a port entry without a port": lambda s, _: s["ingress"][1]["ports"].append({"protocol": "TCP"}),
    "a port range": lambda s, _: s["ingress"][1]["ports"].append({"port": 1, "endPort": 65535}),
    "a broad namespaceSelector": lambda s, _: s["ingress"][0]["from"][0].update({"namespaceSelector": {}}),
    "a namespaceSelector matching every namespace by expression": lambda s, _: s["ingress"][0]["from"][0]
        .update({"namespaceSelector": {"matchExpressions": [{"key": NAMESPACE_NAME, "operator": "Exists"}]}}),
    "namespace and pods as separate peers (OR, not AND)": _split_gateway_peer,
    "a podSelector by NotIn": lambda s, _: s["ingress"][1]["from"][0].update({"podSelector": {
        "matchExpressions": [{"key": L.COMPONENT, "operator": "NotIn", "values": ["operator"]}]}}),
    "a podSelector by Exists": lambda s, _: s["ingress"][0]["from"][0].update({"podSelector": {
        "matchExpressions": [{"key": L.COMPONENT, "operator": "Exists"}]}}),
    "an ipBlock peer": lambda s, _: s["ingress"][0]["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}}),
    "Egress only": lambda s, _: s.update({"policyTypes": ["Egress"]}),
    "a podSelector that misses the pods": lambda s, _: s.update({"podSelector": {"matchLabels": {"a": "b"}}}),
}


@pytest.mark.parametrize("change", sorted(DOCTORED))
@pytest.mark.parametrize(("gateway_ns", "operator_ns"), LAYOUTS)
def test_a_doctored_policy_is_caught(change: str, gateway_ns: str | None, operator_ns: str | None) -> None:
    """Each change opens the pods to someone: the check must name a source it admits wrongly (not merely
    some refusal, which an evaluator too strict about a missing `from` or `ports` would also report)."""
    policy, pod = rendered("minimal", gateway_ns, operator_ns)
    doctored = copy.deepcopy(policy)
    DOCTORED[change](doctored["spec"], gateway_ns or NS)
    found = violations(doctored, pod, gateway_ns or NS, operator_ns or NS)
    assert any("admitted" in v for v in found), (change, found)


def test_a_policy_admitting_nobody_is_caught() -> None:
    """The other way round: an empty ingress list isolates the pods from everyone, the gateway too."""
    policy, pod = rendered("minimal", None, None)
    policy["spec"]["ingress"] = []
    assert f"gateway refused on {podspec.SERVER_PORT}" in violations(policy, pod, NS, NS)


@pytest.mark.parametrize(("rule", "source", "expected"), [
    ({}, Source("x", "a"), True),  # no from, no ports: everything
    ({"from": []}, Source("x", None), True),
    ({"from": [{"podSelector": {}}]}, Source("x", NS), True),  # every pod of the policy's namespace
    ({"from": [{"podSelector": {}}]}, Source("x", "a"), False),
    ({"from": [{"namespaceSelector": {}}]}, Source("x", "a"), True),  # every pod of every namespace
    ({"from": [{"namespaceSelector": {}}]}, Source("x", None), False),
    ({"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}}, "podSelector": {}}]},
     Source("x", "a", namespace_labels={"env": "prod"}), True),
    ({"from": [{"podSelector": {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["v"]}]}}]},
     Source("x", NS), True),  # NotIn matches a pod without the key
    ({"from": [{"podSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}}]},
     Source("x", NS), False),
    ({"from": [{"podSelector": {"matchExpressions": [{"key": "k", "operator": "DoesNotExist"}]}}]},
     Source("x", NS, {"k": "v"}), False),
    ({"ports": [{"protocol": "UDP", "port": 80}]}, Source("x", NS), False),
    ({"ports": [{"port": 70, "endPort": 90}]}, Source("x", NS), True),
    ({"ports": [{"port": 81}]}, Source("x", NS), False),
])
def test_the_evaluator_follows_kubernetes(rule: Manifest, source: Source, expected: bool) -> None:
    """Port 80/TCP of a pod labelled app=p, under one policy holding `rule`; and the policy-level cases."""
    def policy(**spec: Any) -> Manifest:
        return {"metadata": {"namespace": NS}, "spec": {"podSelector": {"matchLabels": {"app": "p"}}, **spec}}

    assert admits(policy(ingress=[rule]), {"app": "p"}, source, 80) is expected
    assert not admits(policy(ingress=[]), {"app": "p"}, Source("x", NS), 80)  # isolated, nothing admitted
    assert not admits(policy(), {"app": "p"}, Source("x", NS), 80)  # policyTypes unset: Ingress implied
    assert admits(policy(policyTypes=["Egress"]), {"app": "p"}, Source("x", NS), 80)  # not isolated
    assert admits(policy(ingress=[]), {"app": "other"}, Source("x", NS), 80)  # not selected


def test_the_charts_policies_admit_only_what_they_say() -> None:
    """Rendered by the real helm: Redis from the release's gateway and operator, the operator from
    nobody, the gateway's HTTP port from anywhere (clients) and none of its other ports."""
    chart = ROOT / "charts" / "llamafleet"
    argv = [str(helm.helm()), "template", "lf", str(chart), "--namespace", "llamafleet"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    pods = {o["metadata"]["name"].removeprefix("lf-llamafleet-"): o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] in ("Deployment", "StatefulSet")}
    policies = {o["metadata"]["name"].removeprefix("lf-llamafleet-"): o for o in objs
                if o["kind"] == "NetworkPolicy"}
    assert sorted(policies) == sorted(pods) == ["gateway", "operator", "redis"]
    other = {k: {**v, L.APP_INSTANCE: "other"} for k, v in pods.items()}
    who = {"gateway": Source("gw", "llamafleet", pods["gateway"]),
           "operator": Source("op", "llamafleet", pods["operator"]),
           "redis": Source("redis", "llamafleet", pods["redis"]),
           "other release's gateway": Source("gw2", "llamafleet", other["gateway"]),
           "gateway labels, other namespace": Source("gw3", "elsewhere", pods["gateway"]),
           "client pod": Source("c", "llamafleet", {"app": "c"}),
           "outside the cluster": Source("internet", None)}
    allowed = {("redis", 6379): {"gateway", "operator"}, ("operator", 8080): set(),
               ("gateway", 8000): set(who)}
    for target, port in [*allowed, ("redis", OTHER_PORT), ("operator", OTHER_PORT), ("gateway", OTHER_PORT)]:
        for name, source in who.items():
            want = name in allowed.get((target, port), set())
            assert admits(policies[target], pods[target], source, port) is want, (target, port, name)


# --- egress (finding 17 of issue 22) --------------------------------------------------------------------

KUBE_DNS = Destination("kube-dns", "kube-system", "10.96.0.10", {"k8s-app": "kube-dns"})
NODE_DNS = Destination("node-local dns", None, "169.254.20.10")
API_SERVER = Destination("api server", None, "172.18.0.2")
METADATA = Destination("cloud metadata", None, "169.254.169.254")
INTERNET = Destination("model host", None, "203.0.113.7")
INTERNET6 = Destination("model host (v6)", None, "2001:db8::7")


def destinations(pod: dict[str, str]) -> dict[str, tuple[Destination, int, str]]:
    """name -> (destination, port, protocol) for everything a fleet pod might try to reach."""
    other_fleet = {**pod, L.FLEET: pod[L.FLEET] + "-other"}
    redis = {"app.kubernetes.io/component": "redis", L.APP_PART_OF: L.PART_OF}
    return {
        "dns (udp)": (KUBE_DNS, 53, "UDP"),
        "dns (tcp)": (KUBE_DNS, 53, "TCP"),
        "node-local dns": (NODE_DNS, 53, "UDP"),
        "peer agent": (Destination("peer", NS, "10.244.0.7", pod), podspec.AGENT_PORT, "TCP"),
        "peer llama-server": (Destination("peer", NS, "10.244.0.7", pod), podspec.SERVER_PORT, "TCP"),
        "peer agent, other namespace": (
            Destination("peer-elsewhere", "elsewhere", "10.244.1.7", pod), podspec.AGENT_PORT, "TCP"),
        "other fleet's agent": (
            Destination("other", NS, "10.244.0.8", other_fleet), podspec.AGENT_PORT, "TCP"),
        "redis": (Destination("redis", "llamafleet", "10.244.2.2", redis), 6379, "TCP"),
        "api server": (API_SERVER, 6443, "TCP"),
        "metadata (http)": (METADATA, 80, "TCP"),
        "metadata (https)": (METADATA, 443, "TCP"),
        "internet (https)": (INTERNET, 443, "TCP"),
        "internet (https, v6)": (INTERNET6, 443, "TCP"),
        "internet (ssh)": (INTERNET, 22, "TCP"),
    }


def egress_violations(policy: Manifest, pod: dict[str, str], downloads: bool) -> list[str]:
    allowed = {"dns (udp)", "dns (tcp)", "node-local dns", "peer agent"}
    if downloads:
        allowed |= {"internet (https)", "internet (https, v6)"}
    found = []
    for name, (dest, port, protocol) in destinations(pod).items():
        want = name in allowed
        if admits_egress(policy, pod, dest, port, protocol) is not want:
            found.append(f"{name} {'refused' if want else 'admitted'}")
    return found


@pytest.mark.parametrize("spec", sorted(p.stem for p in SPECS.glob("*.yaml")))
@pytest.mark.parametrize(("gateway_ns", "operator_ns"), LAYOUTS)
def test_fleet_pods_reach_only_dns_their_peers_and_their_model_host(
    spec: str, gateway_ns: str | None, operator_ns: str | None,
) -> None:
    """Not Redis, not the API server, not other fleets, not metadata services; a model URL's port only for
    a fleet that downloads its model (its init container)."""
    policy, pod = rendered(spec, gateway_ns, operator_ns)
    downloads = "url" in yaml.safe_load((SPECS / f"{spec}.yaml").read_text())["spec"]["model"]["source"]
    assert egress_violations(policy, pod, downloads) == []


DOCTORED_EGRESS: dict[str, Callable[[Manifest], None]] = {
    "no Egress isolation": lambda s: s.update({"policyTypes": ["Ingress"]}),
    "an allow-all rule": lambda s: s["egress"].append({}),
    "peers in every namespace": lambda s: s["egress"][1]["to"][0].update({"namespaceSelector": {}}),
    "peers by namespace only (OR)": lambda s: s["egress"][1]["to"].append(
        {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: NS}}}),
    "dns on every port": lambda s: s["egress"][0].pop("ports"),
    "the download block without its exception": lambda s: s["egress"][2]["to"][0]["ipBlock"].pop("except"),
    "the download rule on every port": lambda s: s["egress"][2].pop("ports"),
}


@pytest.mark.parametrize("change", sorted(DOCTORED_EGRESS))
def test_a_doctored_egress_policy_is_caught(change: str) -> None:
    policy, pod = rendered("minimal", None, None)  # downloads its model: all three rules
    doctored = copy.deepcopy(policy)
    DOCTORED_EGRESS[change](doctored["spec"])
    found = egress_violations(doctored, pod, downloads=True)
    assert any("admitted" in v for v in found), (change, found)


@pytest.mark.parametrize(("rule", "dest", "port", "expected"), [
    ({}, INTERNET, 22, True),
    ({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}]}, METADATA, 80, False),
    ({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}, Destination("pod", NS, "10.244.0.9"), 80, True),
    ({"to": [{"ipBlock": {"cidr": "::/0"}}]}, INTERNET, 80, False),  # another address family
    ({"to": [{"podSelector": {}}]}, INTERNET, 80, False),
    ({"to": [{"podSelector": {}}]}, Destination("pod", NS, "10.244.0.9"), 80, True),
    ({"ports": [{"protocol": "UDP", "port": 53}]}, KUBE_DNS, 53, False),  # TCP asked
])
def test_the_egress_evaluator_follows_kubernetes(rule: Manifest, dest: Destination, port: int,
                                                 expected: bool) -> None:
    def policy(**spec: Any) -> Manifest:
        return {"metadata": {"namespace": NS}, "spec": {"podSelector": {}, **spec}}

    assert admits_egress(policy(policyTypes=["Egress"], egress=[rule]), {}, dest, port) is expected
    assert not admits_egress(policy(policyTypes=["Egress"]), {}, dest, port)  # isolated, nothing admitted
    assert admits_egress(policy(policyTypes=["Ingress"]), {}, dest, port)  # not isolated for egress
    assert not admits_egress(policy(egress=[]), {}, dest, port)  # an egress section implies Egress


def test_the_charts_pods_reach_only_what_they_need() -> None:
    """Gateway: DNS, Redis, the watched namespaces' fleet pods. Operator: the same plus the API server.
    Redis: nothing."""
    chart = ROOT / "charts" / "llamafleet"
    argv = [str(helm.helm()), "template", "lf", str(chart), "--namespace", "llamafleet",
            "--set", "operator.watchNamespaces={llamafleet,team}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    pods = {o["metadata"]["name"].removeprefix("lf-llamafleet-"): o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] in ("Deployment", "StatefulSet")}
    policies = {o["metadata"]["name"].removeprefix("lf-llamafleet-"): o for o in objs
                if o["kind"] == "NetworkPolicy"}
    fleet_pod = {L.FLEET: "f", L.COMPONENT: "server", L.APP_PART_OF: L.PART_OF}
    where = {
        "dns": (KUBE_DNS, 53, "UDP"),
        "redis": (Destination("redis", "llamafleet", "10.244.2.2", pods["redis"]), 6379, "TCP"),
        "other release's redis": (Destination("redis2", "other", "10.244.3.2", pods["redis"]), 6379, "TCP"),
        "fleet llama-server": (
            Destination("f-0", "team", "10.244.4.4", fleet_pod), podspec.SERVER_PORT, "TCP"),
        "fleet agent": (Destination("f-0", "team", "10.244.4.4", fleet_pod), podspec.AGENT_PORT, "TCP"),
        "unwatched fleet": (Destination("g-0", "elsewhere", "10.244.5.5", fleet_pod), podspec.SERVER_PORT,
                            "TCP"),
        "api server": (API_SERVER, 6443, "TCP"),
        "metadata": (METADATA, 80, "TCP"),
        "internet": (INTERNET, 443, "TCP"),
    }
    fleets = {"dns", "redis", "fleet llama-server", "fleet agent"}
    allowed = {"gateway": fleets, "operator": fleets | {"api server", "internet"}, "redis": set()}
    for target, reachable in allowed.items():
        for name, (dest, port, protocol) in where.items():
            want = name in reachable
            # The operator's API server rule is by port (the Service address is rewritten before policies
            # apply): 443 anywhere is the API server's port too.
            got = admits_egress(policies[target], pods[target], dest, port, protocol)
            assert got is want, (target, name)

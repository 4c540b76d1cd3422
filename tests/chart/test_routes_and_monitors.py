"""The Gateway API HTTPRoute beside the Ingress, llama-server's own PodMonitor beside the agents', and
Prometheus admitted by each fleet's NetworkPolicy (issue 23, deployment defects; issue 22, finding 18).

Rendered objects are checked against the released CRD schemas of Gateway API and the Prometheus Operator
(tests/chart/schemas), unknown fields refused; the policy is rendered by the operator from the settings the
chart gives its container, as in a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import Target, render_all
from llamafleet_operator.settings import OperatorSettings
from tests.chart.conftest import Helm, Manifest, by_kind, one, pod_spec
from tests.chart.notes import render_notes
from tests.chart.validation import validate_foreign

PARENTS = '[{"name":"public","namespace":"gateways","sectionName":"https"}]'
ROUTE = ("gateway.httpRoute.enabled=true", "gateway.httpRoute.hostnames={llm.example.com}",
         "gateway.httpRoute.requestTimeout=3600s",
         "gateway.httpRoute.annotations.example\\.com/team=ml")
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def route(helm: Helm, *sets: str) -> list[Manifest]:
    return helm.template(sets=sets, extra=("--set-json", f"gateway.httpRoute.parentRefs={PARENTS}"))


def test_no_http_route_by_default(helm: Helm) -> None:
    assert not by_kind(helm.template(), "HTTPRoute")


def test_http_route_sends_v1_to_the_gateway_service_and_passes_the_gateway_api_schema(helm: Helm) -> None:
    objs = route(helm, *ROUTE)
    obj = one(objs, "HTTPRoute")
    validate_foreign(obj)
    assert obj["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert obj["metadata"]["annotations"]["example.com/team"] == "ml"
    spec = obj["spec"]
    assert spec["parentRefs"] == json.loads(PARENTS) and spec["hostnames"] == ["llm.example.com"]
    (rule,) = spec["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["timeouts"] == {"request": "3600s"}
    # The backend is the clients' Service, on the port that Service exposes (never the metrics one).
    service = one(objs, "Service", "gateway")
    (backend,) = rule["backendRefs"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"] in [p["port"] for p in service["spec"]["ports"]]


def test_http_route_without_parents_fails_with_the_value_named(helm: Helm) -> None:
    assert "gateway.httpRoute.parentRefs" in helm.template_error("gateway.httpRoute.enabled=true")


def test_the_gateway_api_schema_check_can_fail(helm: Helm) -> None:
    obj = one(route(helm, *ROUTE), "HTTPRoute")
    obj["spec"]["rules"][0]["timeouts"] = {"request": "an hour"}
    with pytest.raises(pytest.fail.Exception, match="does not match"):
        validate_foreign(obj)
    obj["spec"]["rules"][0]["timeouts"] = {"requests": "1s"}  # a typo the API server would prune
    with pytest.raises(pytest.fail.Exception, match="requests"):
        validate_foreign(obj)


def _servers_monitor(objs: list[Manifest]) -> Manifest:
    return one(objs, "PodMonitor", "servers")


def test_llama_server_pod_monitor_scrapes_its_metrics_port(helm: Helm) -> None:
    names = [m["metadata"]["name"] for m in by_kind(helm.template(), "PodMonitor")]
    assert not [n for n in names if n.endswith("servers")]
    objs = helm.template(sets=("metrics.serverPodMonitor.enabled=true", "metrics.podMonitor.enabled=true"))
    monitor = _servers_monitor(objs)
    validate_foreign(monitor)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and "authorization" not in endpoint
    # The port the operator gives llama-server, which it starts with --metrics.
    fleet = LlamaFleet.model_validate({"metadata": {"name": "f", "namespace": "llamafleet"}, "spec": {
        "model": {"name": "m", "file": "m.gguf", "source": {"pvc": "models"}}, "image": "llama:1"}})
    deploy = next(o for o in render_all(fleet, Target.of(fleet)) if o["kind"] == "Deployment")
    server = next(c for c in pod_spec(deploy)["containers"] if c["name"] == "llama-server")
    assert "--metrics" in server["args"]
    port = {"name": endpoint["port"], "containerPort": podspec.SERVER_PORT, "protocol": "TCP"}
    assert port in server["ports"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Beside the agents' monitor, which selects the same pods on the agent port.
    agents = one(objs, "PodMonitor", "agents")
    assert agents["spec"]["selector"] == monitor["spec"]["selector"]


def test_llama_server_pod_monitor_sends_the_pod_api_key(helm: Helm) -> None:
    """Fleets with apiKeySecretRef answer 401 on /metrics without the key (only /health is public)."""
    monitor = _servers_monitor(helm.template(sets=(
        "metrics.serverPodMonitor.enabled=true", "podApiKey.existingSecret=llama-key")))
    validate_foreign(monitor)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": "llama-key", "key": "api-key"}}


def _operator_settings(objs: list[Manifest], monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    """The operator's settings from its container's environment, read as in the cluster."""
    (container,) = pod_spec(one(objs, "Deployment", "operator"))["containers"]
    for e in container["env"]:
        if e["name"].startswith("LLAMAFLEET_OPERATOR_METRICS_"):
            monkeypatch.setenv(e["name"], e["value"])
    return OperatorSettings()


def _metrics_rules(settings: OperatorSettings) -> list[dict[str, Any]]:
    fleet = LlamaFleet.model_validate({"metadata": {"name": "f", "namespace": "team-a"}, "spec": {
        "model": {"name": "m", "file": "m.gguf", "source": {"pvc": "models"}}, "image": "llama:1"}})
    target = Target.of(fleet, metrics_peers=tuple(settings.metrics_peers),
                       metrics_server=settings.metrics_server)
    policy = next(o for o in render_all(fleet, target) if o["kind"] == "NetworkPolicy")
    return [r for r in policy["spec"]["ingress"] if r["from"] == [PROMETHEUS]]


@pytest.mark.parametrize(("server_monitor", "ports"), [(False, [8090]), (True, [8080, 8090])])
def test_fleet_policy_admits_the_prometheus_named_in_values(
        helm: Helm, monkeypatch: pytest.MonkeyPatch, server_monitor: bool, ports: list[int]) -> None:
    objs = helm.template(sets=(f"metrics.serverPodMonitor.enabled={str(server_monitor).lower()}",
                               "metrics.podMonitor.enabled=true"),
                         extra=("--set-json", f"metrics.prometheus={json.dumps(PROMETHEUS)}"))
    rules = _metrics_rules(_operator_settings(objs, monkeypatch))
    assert [sorted(p["port"] for p in r["ports"]) for r in rules] == [ports]


def test_without_prometheus_in_values_the_policy_admits_no_one_else(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = helm.template(sets=("metrics.podMonitor.enabled=true",))
    settings = _operator_settings(objs, monkeypatch)
    assert settings.metrics_peers == []
    assert _metrics_rules(settings) == []


def test_operator_refuses_a_metrics_peer_that_is_no_network_policy_peer() -> None:
    with pytest.raises(ValueError, match="not a NetworkPolicyPeer"):
        OperatorSettings(metrics_peers=[{"namespaceSelector": {}, "ipBlock": {"cidr": "10.0.0.0/8"}}])
    with pytest.raises(ValueError, match="not a NetworkPolicyPeer"):
        OperatorSettings(metrics_peers=[{}])


def test_notes_show_the_route_and_warn_when_monitors_cannot_scrape(helm: Helm, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path / "a", *ROUTE, "metrics.podMonitor.enabled=true",
                         "gateway.httpRoute.parentRefs[0].name=public")
    assert "https://llm.example.com/v1" in notes
    assert "metrics.prometheus names no Prometheus pods" in notes
    notes = render_notes(helm, tmp_path / "b", "metrics.serverPodMonitor.enabled=true",
                         "metrics.prometheus.podSelector.matchLabels.app=prometheus")
    assert "names no Prometheus" not in notes

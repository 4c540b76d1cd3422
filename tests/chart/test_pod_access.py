"""How the chart lets the gateway and the operator reach fleet pods (security review findings 6, 13, 18),
checked on rendered objects, read back by the components' own settings classes:

- `podApiKey`: the gateway and the operator mount the Secret and are told the key file (llama-server's
  own API key, which fleets with `apiKeySecretRef` run with); without it, nothing of the kind.
- `podNetworks`: the router's `member_networks` and the operator's `agent_peer_networks` (rendered into
  the agents' `--peer-networks`).
- The agents' PodMonitor scrapes `/metrics` on the agent port with no credential at all: the agents
  serve it without their token (tests/security/test_agent_trust_real.py checks a real agent).
"""

from __future__ import annotations

import pytest

from llamafleet_operator.settings import OperatorSettings
from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import Helm, Manifest, one, pod_spec

KEY_FILE = "/var/run/secrets/llamafleet/pod-api-key/api-key"


def container(objs: list[Manifest], suffix: str) -> Manifest:
    spec = pod_spec(one(objs, "Deployment", suffix))
    found: Manifest = spec["containers"][0]
    found["_volumes"] = spec.get("volumes", [])
    return found


def env(c: Manifest) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_without_pod_values_nothing_is_mounted_and_the_defaults_hold(
    helm: Helm, monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = helm.template()
    for suffix in ("gateway", "operator"):
        c = container(objs, suffix)
        assert not [e for e in env(c) if "POD_API_KEY" in e or "NETWORKS" in e], env(c)
        assert "pod-api-key" not in [m["name"] for m in c["volumeMounts"]]
    for name, value in env(container(objs, "gateway")).items():
        monkeypatch.setenv(name, value)
    assert RouterSettings().resolved_pod_api_key() is None


def test_pod_api_key_and_networks_reach_gateway_and_operator(
    helm: Helm, monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = helm.template(sets=("podApiKey.existingSecret=fleet-llama-key", "podApiKey.existingSecretKey=k",
                               "podNetworks={10.244.0.0/16,fd00:10::/56}"))
    gateway, operator = container(objs, "gateway"), container(objs, "operator")
    for c in (gateway, operator):
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["pod-api-key"]["readOnly"] and KEY_FILE.startswith(mounts["pod-api-key"]["mountPath"])
        volume = next(v for v in c["_volumes"] if v["name"] == "pod-api-key")
        assert volume["secret"]["secretName"] == "fleet-llama-key"
        assert volume["secret"]["items"] == [{"key": "k", "path": "api-key"}]
    assert env(gateway)["LLAMAFLEET_ROUTER_POD_API_KEY_FILE"] == KEY_FILE
    assert env(operator)["LLAMAFLEET_OPERATOR_POD_API_KEY_FILE"] == KEY_FILE

    for name, value in {**env(gateway), **env(operator)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LLAMAFLEET_ROUTER_REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("LLAMAFLEET_OPERATOR_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert RouterSettings().member_networks == ["10.244.0.0/16", "fd00:10::/56"]
    ours = OperatorSettings()
    assert ours.agent_peer_networks == ["10.244.0.0/16", "fd00:10::/56"]
    assert ours.pod_api_key_file is not None and str(ours.pod_api_key_file) == KEY_FILE


def test_a_pod_network_that_is_not_a_cidr_fails_the_render(helm: Helm) -> None:
    assert "podNetworks" in helm.template_error("podNetworks={pods.example}")


def test_the_agents_pod_monitor_scrapes_metrics_without_credentials(helm: Helm) -> None:
    monitor = one(helm.template(sets=("metrics.podMonitor.enabled=true",)), "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("agent", "/metrics")
    # The token that can pull, restore and delete on every pod is never handed to Prometheus.
    for field in ("bearerTokenSecret", "authorization", "basicAuth", "oauth2"):
        assert field not in endpoint, field

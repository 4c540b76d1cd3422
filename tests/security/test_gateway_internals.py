"""The gateway's internals (`/health` details, `/metrics`: pod addresses, uids, busy slots, key names and
their traffic) are for admin keys on the client port, and for Prometheus and probes on the metrics port:

- on the client port, `/health` without a key, or with a tenant's key, says up or down only (200/503
  `{"status"}`), and `/metrics` answers 401 without a key and 403 to a tenant key; an admin key gets both
  in full; `/openapi.json` stays public (it describes the API and holds no state);
- a real `llamafleet router` with `metrics_port` serves both there without a key, while its client port
  keeps them closed;
- the chart: the readiness probe and the ServiceMonitor use the metrics port, which the clients' Service
  and Ingress never expose; the NetworkPolicy opens it only for the ServiceMonitor (or `metricsFrom`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_local.redis_server import free_port
from llamafleet_router.settings import RouterSettings
from llamafleet_testbed import helm as tools
from tests.chart.conftest import Helm, Manifest, by_kind, one, pod_spec
from tests.security.router_process import API_KEY, AUTH, pod_in_thread, router_process
from tests.security.tenant_bed import gateway, pod

KEYS = {"alice": "alice-secret-0123456789", "ops": "ops-secret-0123456789"}
CHAT = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def settings(pods: list[str]) -> RouterSettings:
    return RouterSettings(pods=pods, poll_interval=0.2, admin_keys=["ops"],
                          api_keys=SecretStr(",".join(f"{n}:{k}" for n, k in KEYS.items())))


async def test_client_port_shows_details_to_admin_keys_only() -> None:
    async with pod() as fake, gateway(settings([fake.url]), index=InMemoryPrefixIndex(),
                                      leases=InMemorySlotLeases()) as gw, \
            httpx.AsyncClient(base_url=gw.url) as http:
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=auth("alice"))).status_code == 200
        callers = ({}, auth("alice"), auth("ops"))
        anonymous, tenant, admin = [await http.get("/health", headers=h) for h in callers]
        assert (anonymous.status_code, anonymous.json()) == (200, {"status": "ok"})
        assert (tenant.status_code, tenant.json()) == (200, {"status": "ok"})
        assert admin.status_code == 200 and admin.json()["pods"][0]["url"] == fake.url

        no_key, tenant_metrics, admin_metrics = [await http.get("/metrics", headers=h) for h in callers]
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "missing_api_key"
        assert tenant_metrics.status_code == 403
        assert tenant_metrics.json()["error"]["code"] == "admin_key_required"
        assert "alice" not in no_key.text + tenant_metrics.text
        assert admin_metrics.status_code == 200 and 'key="alice"' in admin_metrics.text
        assert (await http.get("/openapi.json")).status_code == 200  # public: no state in it


async def test_health_without_a_key_says_down_and_nothing_else() -> None:
    """No pod up: 503, and still not a word about which pods there are."""
    async with gateway(settings(["http://127.0.0.1:9"]), index=InMemoryPrefixIndex(),
                       leases=InMemorySlotLeases()) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        down = await http.get("/health")
        admin = await http.get("/health", headers=auth("ops"))
    assert (down.status_code, down.json()) == (503, {"status": "unavailable"})
    assert admin.status_code == 503 and admin.json()["pods_down"] == 1


def test_metrics_port_of_a_real_router_serves_what_the_client_port_keeps_closed(tmp_path: Path) -> None:
    port = free_port()
    with pod_in_thread() as fake, router_process(fake.url, tmp_path, metrics_port=str(port)) as router:
        answer = httpx.post(router.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
        assert answer.status_code == 200
        metrics_url = f"http://127.0.0.1:{port}"
        metrics = httpx.get(metrics_url + "/metrics", timeout=5)
        health = httpx.get(metrics_url + "/health", timeout=5)
        assert metrics.status_code == 200 and 'key="security"' in metrics.text
        assert health.status_code == 200 and health.json()["pods"][0]["url"] == fake.url
        # The client port: closed without a key, and to this (non-admin) key.
        assert httpx.get(router.url + "/metrics", timeout=5).status_code == 401
        assert httpx.get(router.url + "/metrics", headers=AUTH, timeout=5).status_code == 403
        assert httpx.get(router.url + "/health", headers=AUTH, timeout=5).json() == {"status": "ok"}
        assert API_KEY not in metrics.text


# --- the chart -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Iterator[Helm]:
    yield Helm(tools.helm())


def container_port(objs: list[Manifest], name: str) -> int:
    gateway = pod_spec(one(objs, "Deployment", "gateway"))["containers"][0]
    return int(next(p["containerPort"] for p in gateway["ports"] if p["name"] == name))


def test_chart_probes_and_scrapes_the_metrics_port_and_never_exposes_it_to_clients(helm: Helm) -> None:
    objs = helm.template(sets=("metrics.serviceMonitor.enabled=true", "gateway.ingress.enabled=true"))
    gateway = pod_spec(one(objs, "Deployment", "gateway"))["containers"][0]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    port = container_port(objs, "metrics")
    assert env["LLAMAFLEET_ROUTER_METRICS_PORT"] == str(port)
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}

    services = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")
                if "gateway" in s["metadata"]["name"]}
    clients = services["lf-llamafleet-gateway"]
    assert [p["targetPort"] for p in clients["spec"]["ports"]] == ["http"]
    scraped = services["lf-llamafleet-gateway-metrics"]
    assert [(p["name"], p["targetPort"]) for p in scraped["spec"]["ports"]] == [("metrics", "metrics")]
    monitor = one(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(scraped["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert not all(clients["metadata"]["labels"].get(k) == v for k, v in selector.items())
    ingress = one(objs, "Ingress")
    backends = [path["backend"]["service"]
                for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]]
    assert all(b["name"] == "lf-llamafleet-gateway" for b in backends)

    policy = one(objs, "NetworkPolicy", "gateway")
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert port in opened


def test_chart_keeps_the_metrics_port_closed_without_a_scraper(helm: Helm) -> None:
    objs = helm.template()
    policy = one(objs, "NetworkPolicy", "gateway")
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert container_port(objs, "metrics") not in opened
    assert not [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    objs = helm.template(extra=("--set-json", f"networkPolicy.gateway.metricsFrom={json.dumps(prometheus)}"))
    rules = one(objs, "NetworkPolicy", "gateway")["spec"]["ingress"]
    metrics_rule = next(r for r in rules if r["ports"][0]["port"] == container_port(objs, "metrics"))
    assert metrics_rule["from"] == prometheus


def test_chart_tenancy_and_fleet_mapping_reach_the_router_as_it_reads_them(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = helm.template(sets=("gateway.tenancy.adminKeys={ops}", "gateway.tenancy.keyGroups.alice=team-a",
                               "gateway.tenancy.keyGroups.bob=team-b", "gateway.modelFleets.qwen=team-b/tiny",
                               "gateway.tenancy.routingHeadersForAll=true"))
    gateway = pod_spec(one(objs, "Deployment", "gateway"))["containers"][0]
    for e in gateway["env"]:
        if e["name"].startswith("LLAMAFLEET_ROUTER_") and "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
    settings = RouterSettings()
    assert settings.admin_keys == ["ops"] and settings.expose_routing_headers
    assert settings.key_tenants == ["alice:team-a", "bob:team-b"]
    assert settings.model_fleets == ["qwen=team-b/tiny"]
    defaults = helm.template()
    env = {e["name"] for e in pod_spec(one(defaults, "Deployment", "gateway"))["containers"][0]["env"]}
    assert not env & {"LLAMAFLEET_ROUTER_ADMIN_KEYS", "LLAMAFLEET_ROUTER_EXPOSE_ROUTING_HEADERS",
                      "LLAMAFLEET_ROUTER_KEY_TENANTS", "LLAMAFLEET_ROUTER_MODEL_FLEETS"}

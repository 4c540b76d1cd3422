"""The Grafana dashboard queries only metrics that exist, the chart ships it, the Dockerfiles pass
hadolint, and the tool fetcher hands out the pinned helm."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from prometheus_client import CollectorRegistry

from llamafleet_agent.metrics import AgentMetrics
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.snapshots.base import SnapshotMetrics
from llamafleet_testbed import helm as tools
from tests.chart.conftest import CHART, ROOT, Helm, Manifest, by_kind

DASHBOARD = CHART / "dashboards" / "llamafleet.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported_series() -> set[str]:
    """Every series name the gateway (with snapshots on) and the agent export (counters with _total,
    histograms' parts)."""
    registry = CollectorRegistry()
    RouterMetrics(registry)
    SnapshotMetrics(registry)  # the gateway's, registered when snapshots are on
    AgentMetrics(registry)
    return {f.name + s for f in registry.collect() for s in SUFFIXES.get(f.type, ("",))}


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard)
    used = {m for e in exprs for m in re.findall(r"\bllamafleet_[a-z_]+", e)}
    assert used, "no queries found"
    unknown = used - exported_series()
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def test_dashboard_covers_what_operators_watch() -> None:
    """TTFT (upstream and client side), cached-token ratio, predicted vs actual reuse, decisions by
    action, restore counts and times, warm prefixes per pod, degraded mode: each has a panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    text = " ".join(expressions(dashboard))
    for needle in ("upstream_ttft_seconds_bucket", "router_ttft_seconds_bucket", "actual_cached_tokens_total",
                   "prompt_tokens_total",
                   "predicted_cached_tokens_total", "sum by (action) (rate(llamafleet_router_decisions_total",
                   'llamafleet_agent_operations_total{op="restore"}',
                   'llamafleet_agent_operation_seconds_bucket{op="restore"}',
                   "llamafleet_agent_pinned_snapshots", "llamafleet_router_index_degraded"):
        assert needle in text, needle
    # Warm prefixes are the pinned SharedPrefix snapshots, not every snapshot in the folder.
    (warm,) = [p for p in dashboard["panels"] if "warm prefixes" in p["title"].lower()]
    assert "llamafleet_agent_pinned_snapshots" in warm["targets"][0]["expr"]


def test_dashboard_panels_have_unique_ids_and_fit_the_grid() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)


def test_chart_ships_the_dashboard_in_a_labelled_config_map(helm: Helm) -> None:
    maps = [m for m in by_kind(helm.template(), "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]
    (cm,) = maps
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped: Manifest = json.loads(cm["data"]["llamafleet.json"])
    assert shipped == json.loads(DASHBOARD.read_text())


def test_dockerfiles_pass_hadolint() -> None:
    """Images cannot be built here (no Docker engine); the linter is the check that runs."""
    files = [ROOT / "Dockerfile", *sorted((ROOT / "docker").glob("*.Dockerfile"))]
    assert len(files) == 4
    result = subprocess.run([str(tools.hadolint()), "--no-color", *map(str, files)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfiles_run_as_non_root() -> None:
    for path in [ROOT / "Dockerfile", *(ROOT / "docker").glob("*.Dockerfile")]:
        users = re.findall(r"^USER (\S+)", path.read_text(), flags=re.M)
        assert users and users[-1].split(":")[0] not in ("0", "root"), path.name


def test_fetched_helm_is_the_pinned_version(helm: Helm) -> None:
    out = subprocess.run([str(helm.binary), "version", "--short"], capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith(f"v{tools.HELM_VERSION}+")
    kubectl = subprocess.run([str(tools.kubectl()), "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=30)
    assert json.loads(kubectl.stdout)["clientVersion"]["gitVersion"] == f"v{tools.KUBECTL_VERSION}"


def test_own_binary_wins_and_a_bad_one_is_a_clear_error(tmp_path: Any, monkeypatch: Any) -> None:
    own = tmp_path / "helm"
    own.write_text("#!/bin/sh\n")
    monkeypatch.setenv(tools.ENV_HELM, str(own))
    try:
        tools.helm()
    except tools.ToolError as exc:
        assert "not an executable" in str(exc)
    else:
        raise AssertionError("a non-executable LLAMAFLEET_HELM must be refused")
    own.chmod(0o755)
    assert tools.helm() == own

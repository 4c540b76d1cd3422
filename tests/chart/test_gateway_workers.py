"""`gateway.workers` reaches the router as its `workers` setting; the default is the router's own (one
process), and the schema refuses a count the router would refuse."""

from __future__ import annotations

import pytest

from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import Helm
from tests.chart.test_gateway_bounds import router_env, settings_from


def test_one_worker_by_default_as_the_router(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    env = router_env(helm.template())
    assert env["LLAMAFLEET_ROUTER_WORKERS"] == "1"
    assert settings_from(env, monkeypatch).workers == RouterSettings.model_fields["workers"].default


def test_workers_from_values_reach_the_router(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    env = router_env(helm.template(sets=("gateway.workers=4",)))
    settings = settings_from(env, monkeypatch)  # the chart's gateway always has the Redis index
    assert (settings.workers, settings.index) == (4, "redis")


def test_a_worker_count_the_router_refuses_fails_the_render(helm: Helm) -> None:
    assert "workers" in helm.template_error("gateway.workers=0")
    assert "workers" in helm.template_error("gateway.workers=65")

"""The chart's gateway bounds (`gateway.bounds`, `gateway.keyLimits`) reach the router as settings it
reads: the rendered env, read by `RouterSettings` as the router reads its environment, gives the
values asked for; the defaults are the router's own; a malformed per-key limit fails the render."""

from __future__ import annotations

import pytest

from llamafleet_router.api.limited import limiter_from_settings
from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import Helm, Manifest, one, pod_spec


def router_env(objs: list[Manifest]) -> dict[str, str]:
    gateway = pod_spec(one(objs, "Deployment", "gateway"))["containers"][0]
    return {e["name"]: e["value"] for e in gateway["env"]
            if e["name"].startswith("LLAMAFLEET_ROUTER_") and "value" in e}


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> RouterSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return RouterSettings()


def test_default_bounds_are_the_routers_defaults(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(router_env(helm.template()), monkeypatch)
    defaults = RouterSettings.model_fields
    for name in ("max_header_bytes", "header_timeout_s", "body_timeout_s", "max_response_bytes"):
        assert getattr(settings, name) == defaults[name].default, name
    assert not limiter_from_settings(settings).enabled  # no per-key limit unless asked


def test_bounds_and_key_limits_from_values_reach_the_router(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = helm.template(sets=(
        "gateway.bounds.maxHeaderBytes=16384", "gateway.bounds.bodyTimeoutSeconds=30",
        "gateway.bounds.maxResponseBytes=8388608", "gateway.keyLimits.requestsPerMinute={600,batch:6000}",
        "gateway.keyLimits.tokensPerMinute={100000}", "gateway.keyLimits.concurrentRequests={8,batch:32}",
    ), extra=("--set-json", "gateway.bounds.headerTimeoutSeconds=2.5"))  # --set makes 2.5 a string
    settings = settings_from(router_env(objs), monkeypatch)
    assert (settings.max_header_bytes, settings.header_timeout_s, settings.body_timeout_s,
            settings.max_response_bytes) == (16384, 2.5, 30.0, 8388608)
    config = limiter_from_settings(settings).config
    assert (config.requests_per_minute.of("any"), config.requests_per_minute.of("batch")) == (600, 6000)
    assert config.tokens_per_minute.of("any") == 100000
    assert (config.concurrent.of("any"), config.concurrent.of("batch")) == (8, 32)


def test_a_malformed_key_limit_fails_the_render(helm: Helm) -> None:
    assert "requestsPerMinute" in helm.template_error("gateway.keyLimits.requestsPerMinute={lots}")

"""The chart's request bounds (`gateway.requests`) reach the router as the settings of its field
allow-list (`api/fields.py`): the defaults are the router's own, values set in the chart are what the
router reads from the rendered env, and a malformed entry fails the render."""

from __future__ import annotations

import pytest

from llamafleet_router.api.fields import FieldPolicy
from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import Helm
from tests.chart.test_gateway_bounds import router_env, settings_from

FIELDS = ("max_tokens_per_request", "max_n", "max_logprobs", "max_messages", "max_content_parts", "max_tools",
          "max_json_depth", "extra_fields")


def test_default_request_bounds_are_the_routers_defaults(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(router_env(helm.template()), monkeypatch)
    defaults = RouterSettings()
    for name in FIELDS:
        assert getattr(settings, name) == getattr(defaults, name), name


def test_request_bounds_from_values_reach_the_router(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = helm.template(sets=(
        "gateway.requests.maxTokens={4096,batch:65536}", "gateway.requests.maxN=2",
        "gateway.requests.maxLogprobs=5", "gateway.requests.maxMessages=100",
        "gateway.requests.maxContentParts=200", "gateway.requests.maxTools=16",
        "gateway.requests.maxJsonDepth=32", "gateway.requests.extraFields={grammar,batch:lora}",
    ))
    policy = FieldPolicy.from_settings(settings_from(router_env(objs), monkeypatch))
    assert (policy.max_tokens.of("any"), policy.max_tokens.of("batch")) == (4096, 65536)
    assert (policy.max_n, policy.max_logprobs) == (2, 5)
    assert (policy.shapes.max_messages, policy.shapes.max_content_parts, policy.shapes.max_tools,
            policy.shapes.max_json_depth) == (100, 200, 16, 32)
    assert policy.extra.of("any") == {"grammar"} and policy.extra.of("batch") == {"grammar", "lora"}


def test_a_malformed_request_bound_fails_the_render(helm: Helm) -> None:
    assert "maxTokens" in helm.template_error("gateway.requests.maxTokens={lots}")
    assert "maxJsonDepth" in helm.template_error("gateway.requests.maxJsonDepth=500")
    assert "extraFields" in helm.template_error("gateway.requests.extraFields={a b}")

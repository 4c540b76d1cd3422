"""The chart's operator environment, read back by the operator's own settings: what it renders is what
the operator understands (the model -> fleet mapping it shares with the gateway, its agent image)."""

from __future__ import annotations

import pytest

from llamafleet_operator.settings import OperatorSettings
from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import Helm, Manifest, one, pod_spec


def load_env(objs: list[Manifest], component: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Set the plain env values of `component`'s first container; the names set."""
    env = pod_spec(one(objs, "Deployment", component))["containers"][0]["env"]
    names = set()
    for e in env:
        if e["name"].startswith(prefix) and "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
            names.add(e["name"])
    return names


def test_one_model_fleets_value_reaches_the_gateway_and_the_operator(
        helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gateway.modelFleets` is the one source: the operator's ModelConflict follows the gateway's rule."""
    objs = helm.template(sets=("gateway.modelFleets.qwen=team-b/tiny", "gateway.modelFleets.gemma=llm/g"))
    load_env(objs, "operator", "LLAMAFLEET_OPERATOR_", monkeypatch)
    load_env(objs, "gateway", "LLAMAFLEET_ROUTER_", monkeypatch)
    assert OperatorSettings().model_owners() == {"qwen": "team-b/tiny", "gemma": "llm/g"}
    assert sorted(RouterSettings().model_fleets) == sorted(OperatorSettings().model_fleets)
    names = load_env(helm.template(), "operator", "LLAMAFLEET_OPERATOR_", monkeypatch)
    assert "LLAMAFLEET_OPERATOR_MODEL_FLEETS" not in names


@pytest.mark.parametrize(("sets", "image"), [
    ((), "llamafleet/llamafleet:{app_version}"),
    (("image.tag=0.3.1",), "llamafleet/llamafleet:0.3.1"),
    (("image.repository=registry.example/lf", "image.digest=sha256:" + "b" * 64),
     "registry.example/lf@sha256:" + "b" * 64),
])
def test_the_operator_gives_fleets_without_agent_image_the_chart_image(
        helm: Helm, monkeypatch: pytest.MonkeyPatch, sets: tuple[str, ...], image: str) -> None:
    """An upgrade of the chart (a new tag) changes the agent of every fleet that names none."""
    objs = helm.template(sets=sets)
    load_env(objs, "operator", "LLAMAFLEET_OPERATOR_", monkeypatch)
    operator = pod_spec(one(objs, "Deployment", "operator"))["containers"][0]
    app_version = operator["image"].rsplit(":", 1)[-1]
    assert OperatorSettings().agent_image == image.format(app_version=app_version)
    assert OperatorSettings().agent_image == operator["image"], "the operator's own image"

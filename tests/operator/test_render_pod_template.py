"""`spec.podTemplate`: pull secrets, runtime and priority class, llama-server's env, labels and annotations
reach the pods, and never the keys the operator selects and routes by."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from llamafleet_core import labels as L
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import Target, render_all
from tests.operator.test_render import K8S_VERSION, containers, fleet, rendered

ROOT = Path(__file__).resolve().parents[2]


def test_pod_template_settings_reach_the_pods() -> None:
    objs = rendered("gpu-pvc", agent_token_secret="agent-token")
    sts = objs["StatefulSet"]
    pod = sts["spec"]["template"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["priorityClassName"] == "inference-high"
    server, agent = containers(objs)["llama-server"], containers(objs)["agent"]
    env = {e["name"]: e for e in server["env"]}
    assert env["GGML_CUDA_NO_PINNED"] == {"name": "GGML_CUDA_NO_PINNED", "value": "1"}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert "POD_NAME" in env, "the operator's own variables stay"
    assert not {"GGML_CUDA_NO_PINNED", "HF_TOKEN"} & {e["name"] for e in agent["env"]}, "llama-server's only"
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["team"] == "coding" and labels["cost-center"] == "ml-42"
    assert annotations["sidecar.istio.io/inject"] == "false" and L.SPEC_HASH in annotations
    # The workload still selects its pods, and so do the Service, the PDB and the NetworkPolicy.
    for selector in (sts["spec"]["selector"]["matchLabels"], objs["Service"]["spec"]["selector"],
                     objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
                     objs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_without_pod_template_the_pod_spec_has_none_of_its_fields() -> None:
    pod = rendered("minimal")["Deployment"]["spec"]["template"]["spec"]
    assert not {"imagePullSecrets", "runtimeClassName", "priorityClassName"} & pod.keys()


def _with(pod_template: dict[str, Any]) -> LlamaFleet:
    doc = fleet("minimal").model_dump(by_alias=True, exclude_none=True, mode="json")
    doc["spec"]["podTemplate"] = pod_template
    return LlamaFleet.model_validate(doc)


@pytest.mark.parametrize(("pod_template", "message"), [
    ({"labels": {L.FLEET: "other"}},
     f"podTemplate.labels\n  Value error, the operator sets and selects on {L.FLEET}"),
    ({"labels": {L.APP_PART_OF: "x", "team": "a"}}, L.APP_PART_OF),
    ({"annotations": {L.SPEC_HASH: "0"}}, f"the operator sets {L.SPEC_HASH}"),
    ({"env": [{"name": "POD_NAME", "value": "x"}]}, "env POD_NAME: the operator sets"),
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
     "set value or valueFrom, not both"),
    ({"labels": {f"k{i}": "v" for i in range(65)}}, "at most 64 entries"),
])
def test_reserved_keys_are_refused_with_the_field_named(pod_template: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
        _with(pod_template)


def test_an_allowed_label_changes_the_pods_but_not_the_selector() -> None:
    base, labelled = fleet("minimal"), _with({"labels": {"team": "a"}})
    before = {o["kind"]: o for o in render_all(base, Target.of(base))}["Deployment"]
    after = {o["kind"]: o for o in render_all(labelled, Target.of(labelled))}["Deployment"]
    assert after["spec"]["selector"] == before["spec"]["selector"]
    assert after["spec"]["template"]["metadata"]["labels"] == {
        **before["spec"]["template"]["metadata"]["labels"], "team": "a"}


def _crd_rules(*path: str) -> list[dict[str, str]]:
    node = yaml.safe_load((ROOT / "crds" / "llamafleet.io_llamafleets.yaml").read_text())
    node = node["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path:
        node = node["properties"][part] if part != "items" else node["items"]
    rules: list[dict[str, str]] = node["x-kubernetes-validations"]
    return rules


def _refused(rules: list[dict[str, str]], value: Any) -> list[str]:
    env = celpy.Environment()
    out = []
    for rule in rules:
        verdict = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
        assert isinstance(verdict, celpy.celtypes.BoolType), (rule, verdict)
        if not verdict:
            out.append(rule["message"])
    return out


@pytest.mark.parametrize(("path", "value", "refused"), [
    (("podTemplate", "labels"), {"team": "a", "app.kubernetes.io/version": "1"}, False),
    (("podTemplate", "labels"), {L.FLEET: "other"}, True),
    (("podTemplate", "labels"), {L.APP_MANAGED_BY: "me"}, True),
    (("podTemplate", "annotations"), {"example.com/a": "1"}, False),
    (("podTemplate", "annotations"), {L.ATTACH: "true"}, True),
    (("podTemplate", "env", "items"), {"name": "POD_IP", "value": "1.2.3.4"}, True),
    (("podTemplate", "env", "items"), {"name": "A", "value": "1", "valueFrom": {}}, True),
    (("podTemplate", "env", "items"), {"name": "A", "value": "1"}, False),
])
def test_the_crd_refuses_the_same_keys_at_apply(path: tuple[str, ...], value: Any, refused: bool) -> None:
    """The CEL rules in the CRD (what `kubectl apply` meets) agree with the model."""
    assert bool(_refused(_crd_rules(*path), value)) is refused

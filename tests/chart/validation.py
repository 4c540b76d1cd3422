"""How the chart tests validate rendered objects: built-in kinds against the official Kubernetes schemas
(kubernetes-validate, strict: no unknown fields), custom resources against the generated CRD schemas and
the pydantic models (the cross-field rules the CRDs state in CEL), and other projects' kinds (Prometheus
Operator monitors, Gateway API routes) against their released CRD schemas, unknown fields refused."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from llamafleet_core.crd.models import LlamaFleet, SharedPrefix
from tests.chart.conftest import ROOT, Manifest

K8S_VERSION = "1.32"
CRDS = ROOT / "crds"
CR_MODELS: dict[str, Any] = {"LlamaFleet": LlamaFleet, "SharedPrefix": SharedPrefix}
# Kinds of other projects' CRDs that the chart may render, with their released schemas (schemas/README.md).
SCHEMAS = Path(__file__).parent / "schemas"
FOREIGN: dict[str, str] = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitor_v1.json",
    "PodMonitor": "monitoring.coreos.com_podmonitor_v1.json",
    "HTTPRoute": "gateway.networking.k8s.io_httproute_v1.json",
}


@cache
def crd_schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def _strict(node: Any) -> Any:
    """A schema that refuses unknown fields where the API server would prune them (a typo'd key would
    vanish silently there), except under `metadata`, which the CRD schemas leave open."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k != "properties"}
    if "properties" in node:
        out["properties"] = {name: sub if name == "metadata" else _strict(sub)
                             for name, sub in node["properties"].items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def foreign_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = _strict(json.loads((SCHEMAS / FOREIGN[kind]).read_text()))
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate_foreign(obj: Manifest) -> None:
    """A ServiceMonitor, PodMonitor or HTTPRoute against its project's released CRD schema, strictly."""
    versions = {"monitoring.coreos.com/v1", "gateway.networking.k8s.io/v1"}
    assert obj["apiVersion"] in versions, obj["apiVersion"]
    try:
        jsonschema.validate(obj, foreign_schema(obj["kind"]))
    except jsonschema.ValidationError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


def validate_builtin(obj: Manifest) -> None:
    """A built-in object against the official schema of K8S_VERSION, strictly; fails the test if not."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


def validate_custom(obj: Manifest) -> None:
    """A LlamaFleet or SharedPrefix against its CRD schema and its pydantic model."""
    jsonschema.validate(obj, crd_schemas()[obj["kind"]])
    CR_MODELS[obj["kind"]].model_validate(obj)


def validate_all(objs: list[Manifest]) -> None:
    """Every object: custom resources as such, other projects' kinds by their schemas, the rest built-in."""
    for obj in objs:
        if obj["kind"] in CR_MODELS:
            validate_custom(obj)
        elif obj["kind"] in FOREIGN:
            validate_foreign(obj)
        else:
            validate_builtin(obj)

"""How the chart tests validate rendered objects: built-in kinds against the official Kubernetes schemas
(kubernetes-validate, strict: no unknown fields), custom resources against the generated CRD schemas and
the pydantic models (the cross-field rules the CRDs state in CEL)."""

from __future__ import annotations

from functools import cache
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
# Kinds of other operators' CRDs that the chart may render; no schema ships offline for them.
FOREIGN = {"ServiceMonitor", "PodMonitor"}


@cache
def crd_schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


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
    """Every object: custom resources as such, other operators' kinds skipped, the rest built-in."""
    for obj in objs:
        if obj["kind"] in CR_MODELS:
            validate_custom(obj)
        elif obj["kind"] not in FOREIGN:
            validate_builtin(obj)

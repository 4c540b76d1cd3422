"""The CRDs' cross-field rules in CEL: `kubectl apply` rejects what the operator's models reject.

Each case is judged twice: by the generated CRD's `x-kubernetes-validations`, evaluated with cel-python
as the API server does (defaults applied, then every rule at every present node), and by the pydantic
models the operator validates with. Both must agree, with the same message. The CRDs themselves must be
what the API server accepts: the official CustomResourceDefinition schema (of the oldest Kubernetes the
chart supports too), and no rule whose cost the API server cannot bound.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from llamafleet_core.crd import rules as R
from llamafleet_core.crd.fleet import UNQUANTIZED
from llamafleet_core.crd.generate import KINDS
from llamafleet_core.crd.models import LlamaFleetSpec, SharedPrefixSpec
from tests.core.cel_rules import Evaluator, rules, unbounded_calls, with_defaults

ROOT = Path(__file__).resolve().parents[2]
CRDS = {kind.kind: yaml.safe_load((ROOT / "crds" / kind.filename).read_text()) for kind in KINDS}
MODELS: dict[str, Any] = {"LlamaFleet": LlamaFleetSpec, "SharedPrefix": SharedPrefixSpec}
FLEET: dict[str, Any] = {"model": {"name": "m", "file": "m.gguf", "source": {"pvc": "models"}},
                         "image": "llama-server:cpu"}
PREFIX: dict[str, Any] = {"fleetRef": {"name": "f"}}
REF = {"configMapKeyRef": {"name": "prompts", "key": "agent.txt"}}
SYSTEM = [{"role": "system", "content": "You are terse."}]
TOOLS = [{"type": "function", "function": {"name": "f"}}]


def spec_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"])


LF, SP = "LlamaFleet", "SharedPrefix"
# name -> (kind, spec changes, the message of the rule it breaks, or None)
CASES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "fleet defaults": (LF, {}, None),
    "quantized V without flash attention": (
        LF, {"cacheTypeV": "q8_0", "flashAttention": "off"}, R.QUANTIZED_V_NEEDS_FA),
    "quantized V with flash attention": (LF, {"cacheTypeV": "q8_0", "flashAttention": "on"}, None),
    "quantized V, flash attention by default": (LF, {"cacheTypeV": "q4_0"}, None),
    "f16 V without flash attention": (LF, {"cacheTypeV": "f16", "flashAttention": "off"}, None),
    "bf16 V without flash attention": (LF, {"cacheTypeV": "bf16", "flashAttention": "off"}, None),
    "attach on, kvUnified unset (auto: unified)": (LF, {"prefixSharing": {"attach": "on"}}, None),
    "attach on, kvUnified false": (
        LF, {"prefixSharing": {"attach": "on"}, "kvUnified": False}, R.ATTACH_NEEDS_UNIFIED),
    "attach on with a unified KV": (LF, {"prefixSharing": {"attach": "on"}, "kvUnified": True}, None),
    "attach auto without a unified KV": (LF, {"prefixSharing": {"attach": "auto"}}, None),
    "cachePrefix on, RAM cache off": (
        LF, {"prefixSharing": {"cachePrefix": "on"}, "cacheRamMiB": 0}, R.CACHE_PREFIX_NEEDS_RAM),
    "cachePrefix on, RAM cache by default": (LF, {"prefixSharing": {"cachePrefix": "on"}}, None),
    "cachePrefix on, RAM cache unlimited": (
        LF, {"prefixSharing": {"cachePrefix": "on"}, "cacheRamMiB": -1}, None),
    "cachePrefix off, RAM cache off": (
        LF, {"prefixSharing": {"cachePrefix": "off"}, "cacheRamMiB": 0}, None),
    "contextTotal, kvUnified false": (LF, {"contextTotal": 8192, "kvUnified": False},
                                      R.CONTEXT_TOTAL_NEEDS_UNIFIED),
    "contextTotal, kvUnified unset (auto)": (LF, {"contextTotal": 8192}, None),
    "headTokens of the whole slot context": (
        LF, {"contextPerSlot": 4096, "prefixSharing": {"headTokens": 4096}}, R.HEAD_BELOW_SLOT_CONTEXT),
    "headTokens of the default slot context": (
        LF, {"prefixSharing": {"headTokens": 32768}}, R.HEAD_BELOW_SLOT_CONTEXT),
    "headTokens within the slot context": (LF, {"prefixSharing": {"headTokens": 14000}}, None),
    "contextTotal with a unified KV": (LF, {"contextTotal": 8192, "kvUnified": True}, None),
    "pvc storage, a Deployment, no claim": (LF, {"snapshots": {"storage": "pvc"}}, R.PVC_NEEDS_NAME),
    "pvc storage, a Deployment named, no claim": (
        LF, {"snapshots": {"storage": "pvc"}, "workload": "Deployment"}, R.PVC_NEEDS_NAME),
    "pvc storage, a shared claim": (LF, {"snapshots": {"storage": "pvc", "pvcName": "snaps"}}, None),
    "pvc storage, a StatefulSet": (LF, {"snapshots": {"storage": "pvc"}, "workload": "StatefulSet"}, None),
    "memory storage": (LF, {"snapshots": {"storage": "memory"}}, None),
    "two model sources": (LF, {"model": {**FLEET["model"], "source": {"pvc": "m", "hostPath": "/m"}}},
                          "set exactly one of url, pvc, hostPath, image"),
    "messages": (SP, {"messages": SYSTEM}, None),
    "tools": (SP, {"tools": TOOLS}, None),
    "text": (SP, {"text": "You are"}, None),
    "textFrom": (SP, {"textFrom": REF}, None),
    "textFrom beside empty lists": (SP, {"textFrom": REF, "messages": [], "tools": []}, None),
    "text and textFrom": (SP, {"text": "You are", "textFrom": REF}, R.TEXT_OR_TEXT_FROM),
    "textFrom and messages": (SP, {"textFrom": REF, "messages": SYSTEM}, R.TEXT_EXCLUSIVE),
    "text and tools": (SP, {"text": "You are", "tools": TOOLS}, R.TEXT_EXCLUSIVE),
    "nothing": (SP, {}, R.PREFIX_EMPTY),
    "only empty lists": (SP, {"messages": [], "tools": []}, R.PREFIX_EMPTY),
}


def model_error(kind: str, spec: dict[str, Any]) -> str | None:
    try:
        MODELS[kind].model_validate(spec)
    except ValidationError as exc:
        return "; ".join(e["msg"] for e in exc.errors())
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_crds_cel_and_the_operators_models_reject_the_same_specs(case: str) -> None:
    kind, change, broken = CASES[case]
    spec = {**(FLEET if kind == "LlamaFleet" else PREFIX), **change}
    schema = spec_schema(kind)
    evaluator = Evaluator(schema)
    # As the API server evaluates it (defaults first), and without defaulting: a rule that relied on a
    # default being there would fail with "no such key" on an object that skipped it.
    for value in (with_defaults(schema, spec), spec):
        assert evaluator.violations(value) == ([broken] if broken else []), value
    error = model_error(kind, spec)
    if broken is None:
        assert error is None
    else:
        assert error is not None and broken in error


def test_each_cross_field_rule_is_in_cel_and_breaks_in_some_case() -> None:
    """Every rule of rules.py is in the CRD and is broken by some case above (none is dead)."""
    expected = {"LlamaFleet": R.FLEET_SPEC_RULES, "SharedPrefix": R.PREFIX_SPEC_RULES}
    broken = {message for _, _, message in CASES.values()}
    for kind, wanted in expected.items():
        in_crd = list(rules(spec_schema(kind)))
        for rule in wanted:
            assert any(r.path == "" and r.rule == rule["rule"] for r in in_crd), rule
            assert rule["message"] in broken, f"no case breaks {rule['message']!r}"
    assert len(R.FLEET_SPEC_RULES) == 6


def test_the_unquantized_list_in_cel_is_the_models() -> None:
    listed = "[" + ", ".join(f"'{t}'" for t in sorted(UNQUANTIZED)) + "]"
    assert listed == R._UNQUANTIZED_CEL


def oldest_kubernetes() -> str:
    """The oldest Kubernetes the CRD chart supports (its `kubeVersion: ">=1.27.0-0"`), as `1.27`."""
    chart = yaml.safe_load((ROOT / "charts" / "llamafleet-crds" / "Chart.yaml").read_text())
    match = re.fullmatch(r">=\s*(\d+\.\d+)(\.\d+)?(-0)?", chart["kubeVersion"])
    assert match, chart["kubeVersion"]
    return match.group(1)


@pytest.mark.parametrize("kind", sorted(CRDS))
@pytest.mark.parametrize("version", [oldest_kubernetes(), "1.32"])
def test_the_crd_is_a_valid_custom_resource_definition(kind: str, version: str) -> None:
    """The official apiextensions.k8s.io/v1 schema accepts it, strictly (a misspelt `rule` key fails),
    also on the oldest Kubernetes the chart supports (where a rule's `fieldPath` is unknown)."""
    kubernetes_validate.validate(CRDS[kind], version, strict=True)


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_no_rule_iterates_or_scans_an_unbounded_field(kind: str) -> None:
    """The API server estimates each rule's cost from maxItems/maxProperties/maxLength, and refuses a
    CRD whose rules could cost too much: a list macro or string function needs a bounded target."""
    schema = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert unbounded_calls(schema) == []


def test_the_cost_check_flags_an_unbounded_list_and_string() -> None:
    """The check above can fail: a macro over a list without maxItems, a regex on a string without
    maxLength, are reported; bounded ones are not."""
    schema = {"type": "object", "properties": {
        "tools": {"type": "array", "items": {"type": "object"}},
        "names": {"type": "array", "maxItems": 8, "items": {"type": "string"}},
        "text": {"type": "string"}},
        "x-kubernetes-validations": [
            {"rule": "self.tools.all(t, has(t.type))", "message": "a"},
            {"rule": "self.names.all(n, n != '')", "message": "b"},
            {"rule": "self.text.matches('^x')", "message": "c"}]}
    problems = unbounded_calls(schema)
    assert len(problems) == 2 and "self.tools" in problems[0] and "self.text" in problems[1]

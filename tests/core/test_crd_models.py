"""The custom resource models: wire names, defaults, and validation errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from llamafleet_core.crd.models import (
    LlamaFleet,
    LlamaFleetSpec,
    SharedPrefix,
    SharedPrefixSpec,
    quantity_bytes,
)

ROOT = Path(__file__).resolve().parents[2]


def fleet_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "m", "file": "m.gguf", "source": {"url": "https://example.org/m.gguf"}},
        "image": "llama-server:test",
    }
    spec.update(overrides)
    return spec


def error_locations(exc: ValidationError) -> str:
    return " | ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def test_examples_parse_with_the_models() -> None:
    """The shipped examples are valid resources, so `kubectl apply` of them never hits a model error."""
    fleet = LlamaFleet.model_validate(yaml.safe_load((ROOT / "examples/llamafleet.yaml").read_text()))
    prefix = SharedPrefix.model_validate(yaml.safe_load((ROOT / "examples/sharedprefix.yaml").read_text()))
    assert fleet.spec.cache_ram_mib == 16384
    assert fleet.spec.gpu is not None and fleet.spec.gpu.product == "NVIDIA-A40"
    assert prefix.spec.fleet_ref.name == fleet.metadata.name
    assert prefix.spec.tools[0]["function"]["name"] == "read_file"


def test_wire_form_is_camel_case_and_round_trips() -> None:
    """Python uses snake_case, Kubernetes camelCase; dumping and parsing again gives the same spec."""
    spec = LlamaFleetSpec.model_validate(fleet_spec(contextPerSlot=4096, cacheRamMiB=0, kvUnified=True))
    wire = spec.to_k8s()
    assert wire["contextPerSlot"] == 4096 and wire["cacheRamMiB"] == 0 and wire["kvUnified"] is True
    assert "context_per_slot" not in wire
    assert LlamaFleetSpec.model_validate(wire) == spec


def test_defaults_pin_the_kv_layout_when_fields_are_omitted() -> None:
    """Nothing KV-related is left to llama-server's auto: defaults are concrete values, but kvUnified,
    which the operator settles from the image (podspec.for_image) before any pod renders."""
    spec = LlamaFleetSpec.model_validate(fleet_spec())
    layout = (spec.flash_attention, spec.cache_type_k, spec.cache_type_v, spec.kv_unified)
    assert layout == ("on", "f16", "f16", None)
    assert spec.workload == "Deployment" and spec.snapshots.storage == "disk"
    assert spec.n_ctx == spec.slots * spec.context_per_slot


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 257}, "replicas"),
        ({"slots": 100}, "slots"),
        ({"cacheTypeK": "q3_k"}, "cacheTypeK"),
        ({"cacheTypeV": "q8_0", "flashAttention": "off"}, "cacheTypeV"),
        ({"flashAttention": "auto"}, "flashAttention"),
        ({"prefixSharing": {"attach": "on"}, "kvUnified": False}, "kvUnified"),
        ({"contextPerSlot": 4096, "prefixSharing": {"headTokens": 5000}}, "headTokens"),
        ({"snapshots": {"storage": "pvc"}}, "snapshots.pvcName"),
        ({"snapshots": {"sizeLimit": "lots"}}, "sizeLimit"),
        ({"workload": "DaemonSet"}, "workload"),
        ({"unknownField": 1}, "unknownField"),
        ({"model": {"name": "m", "file": "../etc/passwd", "source": {"pvc": "x"}}}, "file"),
        ({"model": {"name": "m", "file": "m.gguf", "source": {"pvc": "x", "hostPath": "/m"}}}, "source"),
        ({"model": {"name": "m", "file": "m.gguf", "source": {}}}, "source"),
    ],
)
def test_invalid_fleet_spec_is_rejected_naming_the_field_when_out_of_range(
    overrides: dict[str, Any], field: str
) -> None:
    """Every rejection says which field is wrong, so a user can fix the manifest from the message alone."""
    with pytest.raises(ValidationError) as info:
        LlamaFleetSpec.model_validate(fleet_spec(**overrides))
    assert field in error_locations(info.value)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"fleetRef": {"name": "f"}, "text": "You are", "messages": [{"content": "x"}]}, "text"),
        ({"fleetRef": {"name": "f"}, "text": "You are", "tools": [{"type": "function"}]}, "text"),
        ({"fleetRef": {"name": "f"}}, "messages"),
        ({"fleetRef": {"name": "F_bad"}, "text": "x"}, "fleetRef.name"),
        ({"fleetRef": {"name": "f"}, "messages": [{"role": "user", "content": "hi"}]}, "role"),
    ],
)
def test_invalid_shared_prefix_is_rejected_naming_the_field(spec: dict[str, Any], field: str) -> None:
    """messages and text are exclusive; a prefix must contain something; only system-side roles."""
    with pytest.raises(ValidationError) as info:
        SharedPrefixSpec.model_validate(spec)
    assert field in error_locations(info.value)


def test_free_form_tool_json_is_kept_verbatim() -> None:
    """Tool schemas are arbitrary JSON: nested keys must survive parsing untouched."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"x-odd": [1, {"a": None}]}}}
    spec = SharedPrefixSpec.model_validate({"fleetRef": {"name": "f"}, "tools": [tool]})
    assert spec.to_k8s()["tools"] == [tool]


@pytest.mark.parametrize(
    ("quantity", "expected"), [("8Gi", 8 << 30), ("500M", 500_000_000), (1024, 1024), ("1.5Ki", 1536)]
)
def test_quantity_bytes_when_given_binary_and_decimal_suffixes(quantity: int | str, expected: int) -> None:
    assert quantity_bytes(quantity) == expected


def test_status_ignores_foreign_keys_when_kopf_stores_progress_there() -> None:
    """kopf may write `status.kopf` and handler results; parsing a stored object must not fail on them."""
    body = yaml.safe_load((ROOT / "examples/llamafleet.yaml").read_text())
    body["status"] = {"ready": "1/2", "kopf": {"progress": {}}, "fleet-reconcile": {"done": True}}
    fleet = LlamaFleet.model_validate(body)
    assert fleet.status is not None and fleet.status.ready == "1/2"

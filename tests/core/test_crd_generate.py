"""The generated CRDs: in sync with the models, structural, and accepting exactly what the models accept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llamafleet_core.crd import generate

ROOT = Path(__file__).resolve().parents[2]
CRDS = {kind.kind: ROOT / "crds" / kind.filename for kind in generate.KINDS}


def openapi(kind: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRDS[kind].read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def test_crds_match_the_models_when_checked() -> None:
    """`generate --check` passes on the committed YAML: run `make crds` after changing a model."""
    assert generate.main(["--check"]) == 0


def test_check_fails_when_a_crd_file_drifted(tmp_path: Path) -> None:
    """The drift check detects an edited file and a missing file."""
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    first = tmp_path / generate.KINDS[0].filename
    first.write_text(first.read_text().replace("minimum: 1", "minimum: 0", 1))
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    first.unlink()
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schema_is_structural(kind: str) -> None:
    """What the API server demands: a type on every node (or an escape hatch), no $ref, no nullable anyOf."""
    for path, node in nodes(openapi(kind)):
        assert "$ref" not in node and "$defs" not in node and "title" not in node, path
        escape = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or escape, f"{path} has no type"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") and node["anyOf"] == [
                {"type": "integer"}, {"type": "string"}], path
        assert node.get("default", 0) is not None, path


def visible(version: dict[str, Any]) -> list[str]:
    """Printer columns `kubectl get` shows without `-o wide`."""
    return [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]


def test_crds_carry_names_columns_and_subresources() -> None:
    """Short names, printer columns and the status subresource that `kubectl get lf`/`sp` rely on."""
    fleet = yaml.safe_load(CRDS["LlamaFleet"].read_text())
    prefix = yaml.safe_load(CRDS["SharedPrefix"].read_text())
    assert fleet["metadata"]["name"] == "llamafleets.llamafleet.io"
    assert fleet["spec"]["names"]["shortNames"] == ["lf"]
    assert prefix["spec"]["names"]["shortNames"] == ["sp"]
    assert prefix["spec"]["names"]["plural"] == "sharedprefixes"
    fv, pv = fleet["spec"]["versions"][0], prefix["spec"]["versions"][0]
    assert fv["subresources"]["status"] == {} and pv["subresources"]["status"] == {}
    assert visible(fv) == ["Model", "Ready", "Slots", "Age"]
    assert visible(pv) == ["Fleet", "Tokens", "Warm", "Bytes", "Age"]
    # Every column points at a field the schema has.
    for version, kind in ((fv, "LlamaFleet"), (pv, "SharedPrefix")):
        schema = openapi(kind)
        for column in version["additionalPrinterColumns"]:
            node = schema
            for part in column["jsonPath"].strip(".").split("."):
                if part == "metadata":
                    break
                node = node["properties"][part]


def test_free_form_fields_are_preserved_not_pruned() -> None:
    """Tool JSON and template kwargs keep unknown keys; quantities accept integers and strings."""
    spec = openapi("SharedPrefix")["properties"]["spec"]["properties"]
    assert spec["tools"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["templateKwargs"]["x-kubernetes-preserve-unknown-fields"] is True
    fleet = openapi("LlamaFleet")["properties"]["spec"]["properties"]
    assert fleet["snapshots"]["properties"]["sizeLimit"]["x-kubernetes-int-or-string"] is True
    rules = [r["rule"] for r in openapi("SharedPrefix")["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("self.text" in r and "self.messages" in r for r in rules)


@pytest.mark.parametrize(
    ("kind", "example"), [("LlamaFleet", "llamafleet.yaml"), ("SharedPrefix", "sharedprefix.yaml")]
)
def test_examples_validate_against_the_crd_schema(kind: str, example: str) -> None:
    """The examples pass the CRD's openAPIV3Schema (the API server's own first check)."""
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    assert doc["kind"] == kind
    jsonschema.validate(doc, openapi(kind))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "replicas"), 0),
        (("spec", "slots"), 100),
        (("spec", "cacheTypeK"), "q3_k"),
        (("spec", "flashAttention"), "auto"),
        (("spec", "snapshots", "storage"), "nfs"),
        (("spec", "model", "sha256"), "not-hex"),
    ],
)
def test_crd_schema_rejects_invalid_fleet_when_a_field_is_out_of_range(
    path: tuple[str, ...], value: Any
) -> None:
    """The schema carries the models' bounds and enums, and its error points at the field."""
    doc = yaml.safe_load((ROOT / "examples/llamafleet.yaml").read_text())
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(doc, openapi("LlamaFleet"))
    assert list(info.value.absolute_path) == list(path)

"""`helm lint --strict` and `helm template` of both charts, every object checked against the official
Kubernetes schemas (kubernetes-validate, strict) and every custom resource against its CRD schema."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from e2e.kind_e2e import manifests

from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.chart.conftest import CHART, CRD_CHART, EXAMPLES, Helm, Manifest, by_kind
from tests.chart.validation import (
    CR_MODELS,
    CRDS,
    FOREIGN,
    K8S_VERSION,
    crd_schemas,
    validate_builtin,
    validate_custom,
    validate_foreign,
)

CASES = [pytest.param((), id="defaults"), *(pytest.param((p,), id=p.stem) for p in EXAMPLES)]


def test_both_examples_exist() -> None:
    assert [p.name for p in EXAMPLES] == ["values-cpu-test.yaml", "values-gpu-a40.yaml"]


@pytest.mark.parametrize("values", CASES)
def test_chart_lints_strictly_when_given(helm: Helm, values: tuple[Path, ...]) -> None:
    """helm lint --strict turns every warning into a failure."""
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["--values", str(v)]
    helm.run(*args)


def test_crd_chart_lints_strictly(helm: Helm) -> None:
    helm.run("lint", "--strict", str(CRD_CHART))


@pytest.mark.parametrize("values", CASES)
def test_every_object_passes_the_official_schema_strictly(helm: Helm, values: tuple[Path, ...]) -> None:
    """No unknown fields, right types, for the pinned Kubernetes version; custom resources are checked by
    the next test, the Prometheus Operator's kinds against its CRD schemas."""
    objs = helm.template(*values)
    assert len(objs) >= 15
    for obj in objs:
        if obj["kind"] in FOREIGN:
            validate_foreign(obj)
        elif obj["kind"] not in CR_MODELS:
            validate_builtin(obj)


@pytest.mark.parametrize("values", CASES)
def test_custom_resources_match_the_crd_schemas(helm: Helm, values: tuple[Path, ...]) -> None:
    """Fleets and prefixes from values validate against the generated CRDs (structure, types, ranges)
    and against the pydantic models (the cross-field rules the CRD states in CEL)."""
    crs = [o for o in helm.template(*values) if o["kind"] in CR_MODELS]
    if values:
        assert {o["kind"] for o in crs} == set(CR_MODELS)
    for obj in crs:
        validate_custom(obj)


def test_a_bad_custom_resource_fails_the_crd_schema(helm: Helm) -> None:
    """The check above can fail: a fleet with slots out of range is rejected."""
    objs = helm.template(sets=("fleets[0].name=bad", "fleets[0].spec.image=x", "fleets[0].spec.slots=0",
                               "fleets[0].spec.model.name=m", "fleets[0].spec.model.file=m.gguf",
                               "fleets[0].spec.model.source.pvc=models"))
    fleet = next(o for o in objs if o["kind"] == "LlamaFleet")
    with pytest.raises(jsonschema.ValidationError, match="less than the minimum"):
        jsonschema.validate(fleet, crd_schemas()["LlamaFleet"])


def test_crd_chart_files_are_copies_of_the_generated_crds() -> None:
    """The CRD chart holds byte-identical copies of crds/: regenerate, then copy (README says how)."""
    generated = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    copies = {p.name: p.read_text() for p in (CRD_CHART / "files").glob("*.yaml")}
    assert generated, "crds/ is empty"
    assert copies == generated, (
        "charts/llamafleet-crds/files differ from crds/: cp crds/*.yaml charts/llamafleet-crds/files/")


def test_crd_chart_renders_the_crds_unchanged_and_kept(helm: Helm) -> None:
    """Rendering through fromYaml/toYaml changes nothing but labels and the keep annotation."""
    rendered = {o["metadata"]["name"]: o for o in helm.template(chart=CRD_CHART)}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        got = rendered[crd["metadata"]["name"]]
        assert got["spec"] == crd["spec"]
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        kubernetes_validate.validate(got, K8S_VERSION, strict=True)
    assert len(rendered) == len(list(CRDS.glob("*.yaml")))


def test_values_schema_rejects_unknown_keys_and_bad_values(helm: Helm) -> None:
    assert "Additional property replica is not allowed" in helm.template_error("gateway.replica=3")
    assert "discovery" in helm.template_error("gateway.discovery=dns")
    assert "agentToken.value" in helm.template_error("agentToken.value=short")


def test_template_guards_fail_with_a_clear_message(helm: Helm) -> None:
    assert "operator.replicas" in helm.template_error("operator.replicas=2")
    assert "redis.external.url" in helm.template_error("redis.enabled=false")
    assert "staticPods" in helm.template_error("gateway.discovery=static")


def test_examples_render_the_objects_they_promise(helm: Helm) -> None:
    gpu = helm.template(CHART / "examples" / "values-gpu-a40.yaml")
    kinds = {o["kind"] for o in gpu}
    assert {"HorizontalPodAutoscaler", "Ingress", "ServiceMonitor", "PodMonitor"} <= kinds
    fleet: Manifest = by_kind(gpu, "LlamaFleet")[0]
    assert fleet["spec"]["gpu"]["product"] == "NVIDIA-A40"
    cpu = helm.template(CHART / "examples" / "values-cpu-test.yaml")
    assert "gpu" not in by_kind(cpu, "LlamaFleet")[0]["spec"]
    assert not by_kind(cpu, "PodDisruptionBudget")


def test_kind_e2e_manifests_match_the_crd_schemas() -> None:
    """The e2e test cannot run here; its LlamaFleet and SharedPrefix are checked offline at least."""
    for obj in manifests(make_profile(WorkloadSpec(prefix_chars=2_000))):
        validate_custom(obj)

"""The kind end-to-end test cannot run here (no Docker engine), but its `helm upgrade --install`
arguments can: `e2e.kind_e2e.releases()` produces them for both the e2e and this test, which templates each
release with exactly those arguments and validates every object the way test_render.py does. It also
checks what the e2e takes for granted of the install: the images it loads into kind, the API key it sends,
the gateway Service it port-forwards, and that the fleet and prefix come only from its own manifests."""

from __future__ import annotations

import base64

import pytest
from e2e import kind_e2e

from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.chart.admission_policy import RenderedPolicy
from tests.chart.conftest import Helm, Manifest, by_kind, one, pod_spec
from tests.chart.validation import CR_MODELS, validate_all
from tests.core.cel_rules import Evaluator, with_defaults

RELEASES = {r.name: r for r in kind_e2e.releases()}


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, list[Manifest]]:
    return {name: helm.render(*r.template_args()) for name, r in RELEASES.items()}


def test_install_and_template_use_the_same_release_chart_namespace_and_values() -> None:
    """The two argument lists differ only in the verb and the install-only flags."""
    for r in RELEASES.values():
        install, template = r.install_args(), r.template_args()
        assert install[:2] == ["upgrade", "--install"] and template[0] == "template"
        install_only = {"--create-namespace", "--wait", "--timeout", "5m"}
        assert [a for a in install[2:] if a not in install_only] == template[1:]
    assert list(RELEASES) == ["llamafleet-crds", kind_e2e.RELEASE], "CRDs first"
    assert any(a.startswith("--set") for a in RELEASES[kind_e2e.RELEASE].values)


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_object_of_the_e2e_install_validates(rendered: dict[str, list[Manifest]], release: str) -> None:
    objs = rendered[release]
    assert objs, f"{release} rendered nothing"
    validate_all(objs)


def test_the_crd_release_installs_both_crds(rendered: dict[str, list[Manifest]]) -> None:
    crds = by_kind(rendered["llamafleet-crds"], "CustomResourceDefinition")
    assert {c["spec"]["names"]["kind"] for c in crds} == set(CR_MODELS)


def test_the_e2e_install_matches_what_the_e2e_assumes(rendered: dict[str, list[Manifest]]) -> None:
    objs = rendered[kind_e2e.RELEASE]
    assert not [o for o in objs if o["kind"] in CR_MODELS], "the e2e applies its own fleet and prefix"
    assert {o["metadata"].get("namespace", kind_e2e.NAMESPACE) for o in objs
            if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")} == {kind_e2e.NAMESPACE}
    for component in ("gateway", "operator"):
        (container,) = pod_spec(one(objs, "Deployment", component))["containers"]
        assert container["image"] == kind_e2e.IMAGE, "the image the e2e builds and loads into kind"
    service = one(objs, "Service", "-gateway")
    assert service["metadata"]["name"] == kind_e2e.GATEWAY_SERVICE
    assert [p["port"] for p in service["spec"]["ports"]] == [80], "the e2e port-forwards port 80"
    (keys,) = [s for s in by_kind(objs, "Secret") if "api-keys" in s["data"]]
    lines = base64.b64decode(keys["data"]["api-keys"]).decode().splitlines()
    assert any(line.split(":", 1)[1] == kind_e2e.API_KEY for line in lines), "the key the e2e sends"


def _crd_refusals(crds: list[Manifest], fleet: Manifest) -> list[str]:
    (crd,) = [c for c in crds if c["spec"]["names"]["kind"] == fleet["kind"]]
    (version,) = crd["spec"]["versions"]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return Evaluator(spec_schema).violations(with_defaults(spec_schema, fleet["spec"]))


def test_what_the_e2e_expects_refused_is_refused_and_its_fleet_admitted(
        rendered: dict[str, list[Manifest]]) -> None:
    """The e2e asks the API server to refuse a fleet by the chart's admission policy and one by the CRD's
    CEL, and applies its own fleet: the same objects, judged offline by the rendered policy and CRDs."""
    policy = RenderedPolicy(one(rendered[kind_e2e.RELEASE], "ValidatingAdmissionPolicy"))
    crds = by_kind(rendered["llamafleet-crds"], "CustomResourceDefinition")
    profile = make_profile(WorkloadSpec(prefix_chars=200))
    fleet, _ = kind_e2e.manifests(profile)
    assert policy.refusals(fleet) == [] and _crd_refusals(crds, fleet) == []
    judges = {"admission policy": policy.refusals, "CRD rule": lambda f: _crd_refusals(crds, f)}
    refused = kind_e2e.refused_manifests(profile)
    assert {what for what, _, _ in refused} == set(judges)
    for what, manifest, message in refused:
        found = judges[what](manifest)
        assert found and any(message in m for m in found), (what, found)

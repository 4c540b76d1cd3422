"""Finding 3: whoever may create a LlamaFleet no longer gets any pod.

Before the fix the operator rendered whatever a fleet asked for: a hostPath of `/`, any image beside the
agent token, control-plane nodes, verbatim llama-server flags; and one agent token, the same in every
namespace, went into every fleet's pods. Now:

- the chart's ValidatingAdmissionPolicy and the operator's own check (reconcile/admission.py) refuse the
  same specs: every case below is judged by both, the operator configured from the chart's rendered
  environment and the policy's CEL evaluated as rendered (cel-python), and they must agree;
- the operator creates nothing for a refused fleet and says why in its status (reason Forbidden);
- each namespace gets its own agent token (HMAC of the master), in a Secret the operator writes there;
  the operator reads no other Secret, and lists none.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from llamafleet_core.agent_tokens import AgentTokens, namespace_token
from llamafleet_core.crd.models import LlamaFleetSpec
from llamafleet_operator.reconcile.admission import AdmissionPolicy, violations
from llamafleet_operator.settings import OperatorSettings
from llamafleet_testbed import helm
from tests.chart.admission_policy import RenderedPolicy
from tests.operator.operator_bed import (
    DEPLOYMENTS,
    FLEETS,
    NS,
    container,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    running_operator,
)

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "llamafleet"
TOKEN_SECRET = "lf-llamafleet-fleet-agent-token"
DIGEST = "sha256:" + "a" * 64
CP = "node-role.kubernetes.io/control-plane"
VALUES = ("admission.hostPathPrefixes={/models}", r"admission.images={registry\.example/llama-server:.*}")
BASE: dict[str, Any] = {
    "model": {"name": "m", "file": "m.gguf", "source": {"pvc": "models"}},
    "image": "registry.example/llama-server:cpu",
    "agentImage": "llamafleet/llamafleet:0.1.0",  # one the fleet chose (the CRD stores no default)
}


def _source(**source: Any) -> dict[str, Any]:
    return {"model": {"name": "m", "file": "m.gguf", "source": source}}


def _node_affinity(required: bool) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": CP, "operator": "Exists"}]}
    if required:
        required_terms = {"nodeSelectorTerms": [term]}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required_terms}}
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": term}]}}


# name -> (spec changes, admitted?)
CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "a pvc model": ({}, True),
    "hostPath /": (_source(hostPath="/"), False),
    "hostPath of the kubelet": (_source(hostPath="/var/lib/kubelet"), False),
    "hostPath the allowed folder": (_source(hostPath="/models"), True),
    "hostPath under it": (_source(hostPath="/models/qwen"), True),
    "hostPath out of it by ..": (_source(hostPath="/models/../etc"), False),
    "hostPath sharing only a prefix": (_source(hostPath="/modelsx"), False),
    "hostPath with //": (_source(hostPath="/models//x"), False),
    "any image": ({"image": "attacker.example/any-image:latest"}, False),
    "a model image from anywhere": (_source(image={"reference": "attacker.example/m:1"}), False),
    "a model image allowed": (_source(image={"reference": "registry.example/llama-server:m"}), True),
    "any agent image": ({"agentImage": "attacker.example/agent:1"}, False),
    "the agent image by digest": ({"agentImage": f"llamafleet/llamafleet@{DIGEST}"}, True),
    "an agent image sharing the prefix": ({"agentImage": "llamafleet/llamafleet-evil:1"}, False),
    "tuning flags and values": ({"extraArgs": ["--swa-full", "-b", "512", "--temp=0.7", "-n", "-1"]}, True),
    "--path serves files": ({"extraArgs": ["--path", "/"]}, False),
    "--alias takes another model's name": ({"extraArgs": ["--alias=other"]}, False),
    "-a as well": ({"extraArgs": ["-a", "other"]}, False),
    "--api-key": ({"extraArgs": ["--api-key", "x"]}, False),
    "--lora loads a file": ({"extraArgs": ["--temp", "0.5", "--lora", "/models/x.gguf"]}, False),
    "a toleration of every taint": ({"tolerations": [{"operator": "Exists"}]}, False),
    "a control-plane toleration": ({"tolerations": [{"key": CP, "operator": "Exists"}]}, False),
    "the master taint": ({"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]},
                         False),
    "a GPU toleration": ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, True),
    "a control-plane node selector": ({"nodeSelector": {CP: ""}}, False),
    "another node selector": ({"nodeSelector": {"pool": "gpu"}}, True),
    "required control-plane affinity": ({"affinity": _node_affinity(True)}, False),
    "preferred control-plane affinity": ({"affinity": _node_affinity(False)}, False),
    "the agent token as the API key": ({"apiKeySecretRef": {"name": TOKEN_SECRET}}, False),
    "another API key Secret": ({"apiKeySecretRef": {"name": "llama-key"}}, True),
    "extra env for llama-server": ({"podTemplate": {"env": [{"name": "GGML_CUDA_NO_PINNED", "value": "1"}]}},
                                   True),
    "a llama-server flag through LLAMA_ARG_*": (
        {"podTemplate": {"env": [{"name": "LLAMA_ARG_STATIC_PATH", "value": "/"}]}}, False),
    "LD_PRELOAD": ({"podTemplate": {"env": [{"name": "LD_PRELOAD", "value": "/models/x.so"}]}}, False),
    "the agent token in llama-server's env": ({"podTemplate": {"env": [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}}}]}}, False),
    "another Secret in llama-server's env": ({"podTemplate": {"env": [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]}}, True),
}


def spec_of(change: dict[str, Any]) -> dict[str, Any]:
    return {**BASE, **change}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    argv = [str(helm.helm()), "template", "lf", str(CHART), "--namespace", "llamafleet"]
    for s in VALUES:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def chart_policy(rendered: list[dict[str, Any]]) -> AdmissionPolicy:
    """The operator's policy exactly as the chart configures it (its container's environment)."""
    (deploy,) = [o for o in rendered
                 if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("operator")]
    env = {e["name"]: e["value"] for e in container(deploy, "operator")["env"] if "value" in e}
    prefix = "LLAMAFLEET_OPERATOR_"
    fields = {k.removeprefix(prefix).lower(): v for k, v in env.items() if k.startswith(prefix)}
    parsed = {k: json.loads(v) if k.startswith(("allowed_", "allow_")) else v for k, v in fields.items()
              if k in OperatorSettings.model_fields}
    return OperatorSettings(**parsed).admission_policy()


@pytest.fixture(scope="module")
def vap(rendered: list[dict[str, Any]]) -> RenderedPolicy:
    (policy,) = [o for o in rendered if o["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [o for o in rendered if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    # Bound to the namespaces this release's operator reconciles.
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["llamafleet"]
    return RenderedPolicy(policy)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_operator_and_the_charts_policy_refuse_the_same_fleets(
        case: str, chart_policy: AdmissionPolicy, vap: RenderedPolicy) -> None:
    change, admitted = CASES[case]
    spec = spec_of(change)
    found = violations(LlamaFleetSpec.model_validate(spec), chart_policy)
    assert (not found) is admitted, found
    fleet = {"apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet",
             "metadata": {"name": "f", "namespace": "llamafleet"}, "spec": spec}
    refused = vap.refusals(fleet)
    assert (not refused) is admitted, refused
    if not admitted:  # both name the same field
        assert {m.split(":")[0] for m in refused} <= {f.split(":")[0] for f in found} | {
            f.split(":")[0].rsplit(".", 1)[0] for f in found}, (refused, found)


def test_the_chart_pins_the_agent_image_to_its_own_repository(rendered: list[dict[str, Any]]) -> None:
    (policy,) = [o for o in rendered if o["kind"] == "ValidatingAdmissionPolicy"]
    agent = next(v for v in policy["spec"]["variables"] if v["name"] == "agentImages")
    assert json.loads(agent["expression"]) == ["llamafleet/llamafleet([:@].*)?"]


def test_operator_defaults_refuse_hostpath_and_control_plane() -> None:
    policy = OperatorSettings().admission_policy()
    assert violations(LlamaFleetSpec.model_validate(spec_of(_source(hostPath="/"))), policy)
    everywhere = spec_of({"tolerations": [{"operator": "Exists"}]})
    assert violations(LlamaFleetSpec.model_validate(everywhere), policy)
    with pytest.raises(ValueError):
        OperatorSettings(allowed_images=["("]).admission_policy()


# --- per-namespace agent tokens ----------------------------------------------------------------------

def test_namespace_tokens_differ_per_namespace_and_never_are_the_master() -> None:
    master = "m" * 48
    a, b = namespace_token(master, "team-a"), namespace_token(master, "team-b")
    assert a != b and master not in (a, b) and len(a) == 64
    assert namespace_token(master, "team-a") == a and namespace_token("x" * 48, "team-a") != a
    tokens = AgentTokens(master, per_namespace=True)
    tokens.place({"http://10.0.0.1:8090": "team-a"})
    assert tokens.for_agent("http://10.0.0.1:8090") == a
    assert tokens.for_agent("http://10.9.9.9:8090") == "", "an agent the membership did not place: nothing"
    assert AgentTokens(master).for_agent("http://127.0.0.1:8090") == master  # local fleets: as configured


def _secret_token(api: Any, namespace: str) -> str | None:
    secret = obj(api, kmock.resource("v1/secrets"), TOKEN_SECRET, namespace)
    return base64.b64decode(secret["data"]["token"]).decode() if secret else None


async def test_operator_refuses_a_forbidden_fleet_and_writes_each_namespace_its_own_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master = "master-token-of-the-release-0123456789"
    async with emulated_api(tmp_path) as (api, kubeconfig):
        resp = await api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": "team-b"}})
        assert resp.status == 201
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS, "team-b"], agent_token=master,
                                    agent_token_secret=TOKEN_SECRET, reconcile_interval_s=0.5,
                                    prefix_interval_s=5.0, allowed_host_paths=["/models"])
        async with running_operator(settings):
            bad = fleet_manifest("root", model={"name": "m", "file": "m.gguf", "source": {"hostPath": "/"}},
                                 tolerations=[{"operator": "Exists"}])
            resp = await api.post(f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/llamafleets", json=bad)
            assert resp.status == 201
            for ns in (NS, "team-b"):
                ok = fleet_manifest("ok")
                ok["metadata"]["namespace"] = ns
                resp = await api.post(f"/apis/llamafleet.io/v1alpha1/namespaces/{ns}/llamafleets", json=ok)
                assert resp.status == 201

            def forbidden() -> dict[str, Any] | None:
                conds = {c["type"]: c for c in ((obj(api, FLEETS, "root") or {}).get("status") or {})
                         .get("conditions") or []}
                return conds.get("Ready") if (conds.get("Ready") or {}).get("reason") == "Forbidden" else None

            ready = await eventually(forbidden, 20, "the refused fleet's status")
            assert "spec.model.source.hostPath: / is not under an allowed folder" in ready["message"]
            assert "spec.tolerations" in ready["message"]
            deploy = await eventually(lambda: obj(api, DEPLOYMENTS, "ok"), 20, "the admitted fleet's pods")
            assert obj(api, DEPLOYMENTS, "root") is None, "nothing may be created for a refused fleet"
            assert obj(api, DEPLOYMENTS, "ok", "team-b") is not None or await eventually(
                lambda: obj(api, DEPLOYMENTS, "ok", "team-b"), 20, "team-b's pods")

            tokens = {ns: await eventually(lambda ns=ns: _secret_token(api, ns), 20, f"{ns}'s token")
                      for ns in (NS, "team-b")}
            assert tokens == {NS: namespace_token(master, NS), "team-b": namespace_token(master, "team-b")}
            assert master not in tokens.values()
            vols = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
            assert vols["agent-token"]["secret"]["secretName"] == TOKEN_SECRET

            # Finding 16: Secrets by name only, never a list or a watch of them.
            paths = [(r.method, r.url.path) for r in api._requests if "/secrets" in r.url.path]
            assert paths and all(p.endswith(f"/secrets/{TOKEN_SECRET}") for _, p in paths), paths


@pytest.mark.parametrize("values", sorted((CHART / "examples").glob("values-*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_example_fleets_are_admitted(values: Path) -> None:
    """The chart's example values files: the fleets they create pass the policy they install."""
    argv = [str(helm.helm()), "template", "lf", str(CHART), "--namespace", "llamafleet",
            "--values", str(values)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (policy,) = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    fleets = [o for o in objs if o["kind"] == "LlamaFleet"]
    assert fleets
    for fleet in fleets:
        assert RenderedPolicy(policy).refusals(fleet) == [], fleet["metadata"]["name"]
    example = yaml.safe_load((ROOT / "examples" / "llamafleet.yaml").read_text())
    policy_of_the_operator = OperatorSettings().admission_policy()
    assert violations(LlamaFleetSpec.model_validate(example["spec"]), policy_of_the_operator) == []

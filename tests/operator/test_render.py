"""Rendered manifests: golden files, the official Kubernetes schemas, and the invariants they must keep.

Regenerate the golden files after an intended change with `UPDATE_GOLDEN=1 pytest tests/operator`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import Target, render_all

HERE = Path(__file__).parent
SPECS = sorted(p.stem for p in (HERE / "specs").glob("*.yaml"))
K8S_VERSION = "1.32"
# Named, not the installed release's: a version bump must not change the golden files.
GOLDEN_AGENT_IMAGE = "llamafleet/llamafleet:0.1.0"


def fleet(name: str) -> LlamaFleet:
    return LlamaFleet.model_validate(yaml.safe_load((HERE / "specs" / f"{name}.yaml").read_text()))


def rendered(name: str, **options: Any) -> dict[str, dict[str, Any]]:
    f = fleet(name)
    return {obj["kind"]: obj for obj in render_all(f, Target.of(f, **options))}


def containers(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    workload = objs.get("Deployment") or objs["StatefulSet"]
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def test_three_specs_are_covered() -> None:
    assert SPECS == ["gpu-pvc", "minimal", "unified-attach"]


@pytest.mark.parametrize("name", SPECS)
def test_render_matches_golden(name: str) -> None:
    """Rendering is pure and stable: the same spec always gives byte-identical manifests."""
    f = fleet(name)
    text = yaml.safe_dump_all(render_all(f, Target.of(f, agent_image=GOLDEN_AGENT_IMAGE)), sort_keys=False,
                              width=120)
    golden = HERE / "golden" / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}: run with UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden} differs: run with UPDATE_GOLDEN=1 if the change is intended"


@pytest.mark.parametrize("name", SPECS)
def test_every_object_passes_the_official_schema_strictly(name: str) -> None:
    """kubernetes-validate --strict: no unknown fields, right types, for the pinned Kubernetes version."""
    objs = rendered(name, agent_token_secret="agent-token", operator_namespace="llamafleet-system")
    for obj in objs.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", SPECS)
def test_selectors_match_the_pods_when_rendered(name: str) -> None:
    """Workload, Service, PDB and NetworkPolicy all select exactly the fleet's pod template labels."""
    objs = rendered(name)
    workload = objs.get("Deployment") or objs["StatefulSet"]
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    selectors = [
        workload["spec"]["selector"]["matchLabels"], objs["Service"]["spec"]["selector"],
        objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        objs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector and all(pod_labels.get(k) == v for k, v in selector.items())
    for obj in objs.values():
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "LlamaFleet"
        assert obj["metadata"]["labels"][L.FLEET] == fleet(name).metadata.name


def test_minimal_fleet_downloads_the_model_and_runs_as_non_root() -> None:
    objs = rendered("minimal")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "fetch-model"
    assert "https://models.example/tiny-qwen2.gguf" in pod["initContainers"][0]["command"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    server, agent = containers(objs)["llama-server"], containers(objs)["agent"]
    assert server["startupProbe"]["httpGet"]["path"] == "/health"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "nodeSelector" not in pod and "nvidia.com/gpu" not in str(server["resources"])
    snapshots = next(v for v in pod["volumes"] if v["name"] == "snapshots")
    assert snapshots["emptyDir"] == {"sizeLimit": "8Gi"}


def test_gpu_statefulset_gets_gpus_any_gpu_node_and_a_claim_per_pod() -> None:
    """No `gpu.product`: the pod schedules on any GPU node (a default product would leave a first
    install on any other GPU pending forever); a product given is a node selector."""
    objs = rendered("gpu-pvc")
    sts = objs["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    server = containers(objs)["llama-server"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu.product" not in pod.get("nodeSelector", {})
    pinned = rendered("unified-attach")["Deployment"]["spec"]["template"]["spec"]
    assert pinned["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A40"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    assert dedicated in pod["tolerations"]
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "snapshots" and claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert all(v["name"] != "snapshots" for v in pod["volumes"])
    assert sts["spec"]["serviceName"] == objs["Service"]["metadata"]["name"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models["persistentVolumeClaim"] == {"claimName": "gguf-models", "readOnly": True}
    assert server["args"][server["args"].index("--api-key-file") + 1].endswith("/api-key")


def test_unified_attach_fleet_passes_attach_to_server_and_agent() -> None:
    objs = rendered("unified-attach")
    server, agent = containers(objs)["llama-server"], containers(objs)["agent"]
    assert "--slot-attach" in server["args"] and "--attach" in agent["args"]
    assert server["args"][-1] == "--swa-full"
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    snapshots = next(v for v in pod["volumes"] if v["name"] == "snapshots")
    assert snapshots["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert pod["initContainers"][0]["image"] == "llamafleet/models:hermes-4-14b"
    assert '"attach": true' in objs["ConfigMap"]["data"]["fleet.json"]


def test_snapshot_folder_is_shared_by_server_and_agent() -> None:
    """The agent manages exactly the folder llama-server saves into."""
    for name in SPECS:
        cs = containers(rendered(name))
        server_args = cs["llama-server"]["args"]
        save_path = server_args[server_args.index("--slot-save-path") + 1]
        agent_dir = cs["agent"]["args"][cs["agent"]["args"].index("--snapshot-dir") + 1]
        assert save_path == agent_dir == podspec.SNAPSHOT_DIR
        for c in cs.values():
            assert any(m["name"] == "snapshots" and m["mountPath"] == save_path for m in c["volumeMounts"])


def test_network_policy_admits_only_gateway_operator_and_peers() -> None:
    """Clients never reach llama-server's admin endpoints: only gateway, operator and peer agents may."""
    policy = rendered("minimal", operator_namespace="llamafleet-system")["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]  # egress: tests/security/test_network_policy.py
    control, peers = policy["ingress"]
    components = [p["podSelector"]["matchLabels"][L.COMPONENT] for p in control["from"]]
    assert components == ["gateway", "operator"]
    # The gateway of the fleet's own namespace, named explicitly (finding 17 of issue 22).
    assert control["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "demo"}
    assert control["from"][1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "llamafleet-system"}
    assert peers["from"][0]["podSelector"]["matchLabels"] == L.fleet_labels("tiny")
    assert peers["ports"] == [{"protocol": "TCP", "port": podspec.AGENT_PORT}]


def test_pod_template_hash_changes_when_the_spec_changes() -> None:
    """Pods roll when (and only when) their rendered spec changes."""
    f = fleet("minimal")

    def h(x: LlamaFleet) -> str:
        workload = render_all(x, Target.of(x))[2]
        return str(workload["spec"]["template"]["metadata"]["annotations"][L.SPEC_HASH])

    same = f.model_copy(deep=True)
    changed = f.model_copy(update={"spec": f.spec.model_copy(update={"slots": 8})})
    assert h(f) == h(same) != h(changed)

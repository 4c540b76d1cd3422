"""The operator end to end against the emulated API: LlamaFleet children, updates, deletion, restarts.

kopf runs in-process (`kopf.operator`) with the operator's real handlers and settings; the API is the kmock
emulator with the fixes in `kmock_support.py`. No pods run here: the SharedPrefix test realizes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest

from llamafleet_core import labels as L
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kmock_support import KubeEmulator
from tests.operator.operator_bed import (
    DEPLOYMENTS,
    FLEETS,
    NS,
    PREFIXES,
    container,
    create,
    delete,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    patch_spec,
    running_operator,
)

CHILDREN = (
    ("v1/configmaps", "tiny-config"), ("v1/services", "tiny"), ("apps/v1/deployments", "tiny"),
    ("policy/v1/poddisruptionbudgets", "tiny"), ("networking.k8s.io/v1/networkpolicies", "tiny"),
)


PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def settings(kubeconfig: str, **overrides: Any) -> OperatorSettings:
    values: dict[str, Any] = {"kubeconfig": kubeconfig, "namespaces": [NS], "reconcile_interval_s": 1.0,
                              "prefix_interval_s": 1.0, "agent_token_secret": "agent-token"}
    return OperatorSettings(**{**values, **overrides})


def children(api: KubeEmulator) -> dict[str, dict[str, Any] | None]:
    return {f"{res}/{name}": obj(api, kmock.resource(res), name) for res, name in CHILDREN}


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


async def test_fleet_children_created_with_right_arguments_when_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Applying a LlamaFleet creates every child, owned by the fleet, with the spec's llama-server flags."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            fleet = await create(api, fleet_manifest(replicas=2, slots=3, cacheTypeK="q8_0"))
            found = await eventually(lambda: all(children(api).values()) and children(api), what="children")
            uid = fleet["metadata"]["uid"]
            for key, child in found.items():
                assert child is not None
                refs = child["metadata"]["ownerReferences"]
                owners = [(r["kind"], r["uid"], r["controller"]) for r in refs]
                assert owners == [("LlamaFleet", uid, True)], key
                assert child["metadata"]["labels"][L.FLEET] == "tiny"
            deploy = found["apps/v1/deployments/tiny"]
            assert deploy is not None
            assert deploy["spec"]["replicas"] == 2
            args = container(deploy, "llama-server")["args"]
            assert arg(args, "-np") == "3" and arg(args, "-ctk") == "q8_0" and arg(args, "-a") == "tiny-qwen2"
            assert arg(args, "-c") == str(3 * 32768)
            agent = container(deploy, "agent")["args"]
            assert arg(agent, "--slots") == "3" and arg(agent, "--cache-type-k") == "q8_0"

            status = await eventually(
                lambda: (obj(api, FLEETS, "tiny") or {}).get("status", {}).get("ready"), what="status")
            assert status == "0/2"


async def test_network_policy_admits_gateway_and_operator_from_their_namespaces_when_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart runs the gateway and the operator in the release namespace, not the fleet's: the policy
    must select them there, or every request from the gateway is dropped."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        monkeypatch.setenv("POD_NAMESPACE", "llamafleet-system")
        async with running_operator(settings(kubeconfig, gateway_namespace="gateways",
                                             metrics_peers=[PROMETHEUS], metrics_server=True)):
            await create(api, fleet_manifest())
            policy = await eventually(
                lambda: obj(api, kmock.resource("networking.k8s.io/v1/networkpolicies"), "tiny"),
                what="network policy")
            sources = policy["spec"]["ingress"][0]["from"]
            namespaces = {
                peer["podSelector"]["matchLabels"][L.COMPONENT]:
                    peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                for peer in sources
            }
            assert namespaces == {"gateway": "gateways", "operator": "llamafleet-system"}
            # Prometheus (issue 22: it was blocked from the agents' /metrics) reaches both metrics ports.
            prometheus = [r for r in policy["spec"]["ingress"] if r["from"] == [PROMETHEUS]]
            assert [sorted(p["port"] for p in r["ports"]) for r in prometheus] == [[8080, 8090]]
            # The status is patched after the children are applied: the policy can be seen first.
            full = await eventually(lambda: _with_status(obj(api, FLEETS, "tiny")), what="fleet status")
            conds = {c["type"]: c for c in full["status"]["conditions"]}
            assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "ReplicasNotReady"
            assert conds["Progressing"]["reason"] == "ScalingUp"
            assert full["status"]["observedGeneration"] == full["metadata"]["generation"]

            def messages() -> list[Any]:
                return [e.raw.get("message") for (res, _, _), e in api.objects.items()
                        if res == kmock.resource("v1/events") and not e.deleted]

            await eventually(lambda: "created Deployment tiny" in messages(), what="the creation event")
            assert not api.errors


def _with_status(fleet: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fleet once its status carries conditions (None before)."""
    return fleet if fleet is not None and fleet.get("status", {}).get("conditions") else None


async def test_fleet_children_updated_when_spec_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing replicas and slots re-renders the workload: new replica count, new `-np`, new pod hash."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            await create(api, fleet_manifest(replicas=1, slots=2))
            first = await eventually(lambda: obj(api, DEPLOYMENTS, "tiny"), what="deployment")
            await patch_spec(api, "llamafleets", "tiny", {"replicas": 3, "slots": 4})

            def updated() -> dict[str, Any] | None:
                d = obj(api, DEPLOYMENTS, "tiny")
                return d if d and d["spec"]["replicas"] == 3 else None

            deploy = await eventually(updated, what="replicas 3")
            assert arg(container(deploy, "llama-server")["args"], "-np") == "4"
            old_hash = first["spec"]["template"]["metadata"]["annotations"][L.SPEC_HASH]
            assert deploy["spec"]["template"]["metadata"]["annotations"][L.SPEC_HASH] != old_hash
            cm = obj(api, kmock.resource("v1/configmaps"), "tiny-config")
            assert cm is not None and '"slots": 4' in cm["data"]["fleet.json"]
            await eventually(lambda: (obj(api, FLEETS, "tiny") or {}).get("status", {}).get("ready") == "0/3",
                             what="status follows the new replica count")


async def test_fleet_children_gone_when_fleet_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleting the fleet removes every child (through their ownerReferences) and the fleet itself."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            await create(api, fleet_manifest())
            await eventually(lambda: all(children(api).values()), what="children")
            await delete(api, f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/llamafleets/tiny")
            await eventually(lambda: not any(children(api).values()) and obj(api, FLEETS, "tiny") is None,
                             what="children and fleet gone")


async def test_operator_converges_when_restarted_midway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes made while the operator is down (spec edit, a child deleted) are repaired after it restarts."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)) as op:
            await create(api, fleet_manifest(replicas=1))
            await eventually(lambda: all(children(api).values()), what="children")
            await op.stop()
            await patch_spec(api, "llamafleets", "tiny", {"replicas": 2})
            await delete(api, f"/api/v1/namespaces/{NS}/configmaps/tiny-config")
            await delete(api, f"/apis/apps/v1/namespaces/{NS}/deployments/tiny")
            assert obj(api, DEPLOYMENTS, "tiny") is None
            await op.start()

            def converged() -> bool:
                d = obj(api, DEPLOYMENTS, "tiny")
                return bool(d and d["spec"]["replicas"] == 2 and all(children(api).values()))

            await eventually(converged, what="deployment back with 2 replicas, config map back")


@pytest.mark.parametrize(("spec", "field"), [
    ({"replicas": 0}, "spec.replicas"),
    ({"cacheTypeV": "q4_0", "flashAttention": "off"}, "cacheTypeV"),
    ({"model": {"name": "m", "file": "m.gguf", "source": {}}}, "model.source"),
    # The fleet's own labels may not take the keys the operator selects its pods by.
    ({"podTemplate": {"labels": {L.FLEET: "other"}}},
     f"spec.podTemplate.labels: the operator sets and selects on {L.FLEET}"),
])
async def test_invalid_spec_rejected_with_field_named_when_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any], field: str) -> None:
    """An invalid spec creates no children; status says Failed with a message naming the field."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            await create(api, fleet_manifest(**spec))

            def failed() -> dict[str, Any] | None:
                status = (obj(api, FLEETS, "tiny") or {}).get("status") or {}
                return status if status.get("phase") == "Failed" else None

            status = await eventually(failed, what="Failed status")
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert ready["reason"] == "InvalidSpec"
            assert field in ready["message"], ready["message"]
            assert not any(children(api).values())


async def test_shared_prefix_status_explains_when_spec_invalid_or_fleet_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid SharedPrefix spec fails naming the field; one whose fleet is missing waits, saying so."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            base = {"apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix"}
            await create(api, {**base, "metadata": {"name": "bad", "namespace": NS},
                               "spec": {"fleetRef": {"name": "tiny"}, "text": "x",
                                        "messages": [{"content": "y"}]}})
            await create(api, {**base, "metadata": {"name": "orphan", "namespace": NS},
                               "spec": {"fleetRef": {"name": "nowhere"}, "text": "x"}})

            def phase(name: str, want: str) -> dict[str, Any] | None:
                status = (obj(api, PREFIXES, name) or {}).get("status") or {}
                return status if status.get("phase") == want else None

            bad = await eventually(lambda: phase("bad", "Failed"), what="bad prefix Failed")
            ready = next(c for c in bad["conditions"] if c["type"] == "Ready")
            assert ready["reason"] == "InvalidSpec" and "text: exclusive" in ready["message"]
            orphan = await eventually(lambda: phase("orphan", "Pending"), what="orphan Pending")
            ready = next(c for c in orphan["conditions"] if c["type"] == "Ready")
            assert ready["reason"] == "FleetNotFound" and "spec.fleetRef.name" in ready["message"]
            # Nothing to clean up: deletion goes through at once.
            await delete(api, f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/sharedprefixes/orphan")
            await eventually(lambda: obj(api, PREFIXES, "orphan") is None, what="orphan deleted")

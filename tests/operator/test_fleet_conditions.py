"""The fleet's conditions end to end against the emulated API: stuck pods, model conflicts, the agent image.

kopf runs the operator's real handlers in-process (`operator_bed`); pods are Pod objects the test writes
with the statuses a kubelet and a scheduler would report, since nothing here needs them to run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import pytest

from llamafleet_core import labels as L
from llamafleet_operator import release
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kmock_support import KubeEmulator
from tests.operator.operator_bed import (
    DEPLOYMENTS,
    FLEETS,
    NS,
    PODS,
    container,
    create,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    running_operator,
)

EVENTS = kmock.resource("v1/events")
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"
SCHEDULER = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
OTHER_NS = "team-b"


def settings(kubeconfig: str, **overrides: Any) -> OperatorSettings:
    values: dict[str, Any] = {"kubeconfig": kubeconfig, "namespaces": [NS], "reconcile_interval_s": 1.0,
                              "prefix_interval_s": 1.0, "agent_token_secret": "agent-token"}
    return OperatorSettings(**{**values, **overrides})


def events(api: KubeEmulator, about: str, namespace: str = NS) -> list[str]:
    """Messages of the events posted on object `about`, oldest first."""
    return [e.raw.get("message", "") for (res, ns, _), e in api.objects.items()
            if res == EVENTS and ns == namespace and not e.deleted
            and (e.raw.get("involvedObject") or {}).get("name") == about]


def condition_of(api: KubeEmulator, fleet: str, type_: str, namespace: str = NS) -> dict[str, Any] | None:
    conds = ((obj(api, FLEETS, fleet, namespace) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def with_reason(api: KubeEmulator, fleet: str, type_: str, reason: str,
                namespace: str = NS) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        cond = condition_of(api, fleet, type_, namespace)
        return cond if cond is not None and cond["reason"] == reason else None
    return probe


def fleet_pod(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": L.fleet_labels("tiny")},
            "spec": {"containers": [{"name": "llama-server", "image": "llamafleet/llama-server:cpu"}]},
            "status": status}


UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}]}
INIT_CRASH_LOOP = {
    "phase": "Pending",
    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
    "initContainerStatuses": [{
        "name": "fetch-model", "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                     "message": "HTTP Error 404: Not Found"}},
    }],
}
# Ready without a podIP: the operator then calls no agent (nothing listens here).
READY = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                            {"type": "Ready", "status": "True"}]}


def pod_reads(api: KubeEmulator) -> int:
    """How many times the operator listed the fleet's pods: one per reconcile."""
    return sum(1 for r in api._requests if r.resource == PODS and r.namespace == NS
               and "llamafleet.io/fleet=tiny" in r.params.get("labelSelector", ""))


async def set_pod_status(api: KubeEmulator, name: str, status: dict[str, Any]) -> None:
    resp = await api.patch(f"{PODS_PATH}/{name}/status", json={"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


async def test_stuck_pods_reported_in_degraded_and_as_events_until_they_recover(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unschedulable pod and an init crash loop make the fleet Degraded with their own reasons and
    messages (not `Progressing: PodsStarting` forever), post Warning events, and clear when they heal."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            # The pods first: the fleet's first reconcile sees both (no intermediate state to report).
            for name, status in (("tiny-0", UNSCHEDULABLE), ("tiny-1", INIT_CRASH_LOOP)):
                resp = await api.post(PODS_PATH, json=fleet_pod(name, status))
                assert resp.status == 201, await resp.text()
            await create(api, fleet_manifest(replicas=2))

            both = await eventually(with_reason(api, "tiny", "Degraded", "PodsFailing"), what="Degraded")
            assert both["status"] == "True"
            assert both["message"] == (
                f"tiny-0: {SCHEDULER}; tiny-1: init container fetch-model keeps crashing, "
                "last exit: Error (code 1): HTTP Error 404: Not Found, 4 restarts")
            progressing = condition_of(api, "tiny", "Progressing")
            assert progressing is not None and (progressing["status"], progressing["reason"]) == (
                "False", "PodsStuck")
            assert (obj(api, FLEETS, "tiny") or {})["status"]["phase"] == "Degraded"
            await eventually(lambda: any(m.startswith("Degraded (PodsFailing): tiny-0: 0/3 nodes")
                                         for m in events(api, "tiny")), what="the Degraded event")

            await set_pod_status(api, "tiny-1", {**READY, "initContainerStatuses": None})
            alone = await eventually(with_reason(api, "tiny", "Degraded", "Unschedulable"),
                                     what="Degraded: Unschedulable")
            assert alone["message"] == f"tiny-0: {SCHEDULER}"

            await set_pod_status(api, "tiny-0", READY)
            await eventually(with_reason(api, "tiny", "Degraded", "AsExpected"), what="Degraded cleared")
            await eventually(lambda: "Degraded cleared (AsExpected)" in events(api, "tiny"),
                             what="the recovery event")
            # One event per change of what is wrong, however many reconciles pass.
            reads = pod_reads(api)
            await eventually(lambda: pod_reads(api) >= reads + 3, what="three more reconciles")
            posted = [m for m in events(api, "tiny") if m.startswith("Degraded")]
            assert [m.split(":")[0] for m in posted] == [
                "Degraded (PodsFailing)", "Degraded (Unschedulable)", "Degraded cleared (AsExpected)"], posted
            assert not api.errors


async def test_a_model_two_fleets_serve_is_a_conflict_on_both_until_renamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cluster-wide, two fleets in two namespaces serving one model name both say ModelConflict, each
    naming the other; renaming one model clears it on both (level-based)."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig, namespaces=[])):
            await create(api, fleet_manifest("a"))
            other = fleet_manifest("b")
            other["metadata"]["namespace"] = OTHER_NS
            await create(api, other)

            on_a = await eventually(with_reason(api, "a", "ModelConflict", "ModelServedByOtherFleets"),
                                    what="conflict on a")
            on_b = await eventually(
                with_reason(api, "b", "ModelConflict", "ModelServedByOtherFleets", OTHER_NS), what="b")
            assert on_a["status"] == on_b["status"] == "True"
            assert on_a["message"].startswith(f"model tiny-qwen2 is also served by {OTHER_NS}/b:")
            assert on_b["message"].startswith(f"model tiny-qwen2 is also served by {NS}/a:")
            await eventually(lambda: any(m.startswith("ModelConflict (ModelServedByOtherFleets)")
                                         for m in events(api, "b", OTHER_NS)), what="the conflict event on b")

            resp = await api.patch(f"/apis/llamafleet.io/v1alpha1/namespaces/{OTHER_NS}/llamafleets/b",
                                   json={"spec": {"model": {"name": "tiny-qwen2-b"}}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert resp.status == 200, await resp.text()
            await eventually(with_reason(api, "a", "ModelConflict", "Unique"), what="a cleared")
            await eventually(with_reason(api, "b", "ModelConflict", "Unique", OTHER_NS), what="b cleared")
            await eventually(lambda: "ModelConflict cleared (Unique)" in events(api, "a"),
                             what="the event that it is resolved")
            assert not api.errors


async def test_model_fleets_mapping_resolves_the_conflict_in_watched_namespaces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the gateway's mapping the name is no conflict: the mapped fleet says Mapped, the other that
    it receives none of its model's requests. Namespaced mode sees the fleets of every watched namespace."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        # kopf serves the listed namespaces that exist.
        resp = await api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": OTHER_NS}})
        assert resp.status == 201, await resp.text()
        mapped = settings(kubeconfig, namespaces=[NS, OTHER_NS], model_fleets=[f"tiny-qwen2={OTHER_NS}/b"])
        async with running_operator(mapped):
            await create(api, fleet_manifest("a"))
            other = fleet_manifest("b")
            other["metadata"]["namespace"] = OTHER_NS
            await create(api, other)
            on_a = await eventually(with_reason(api, "a", "ModelConflict", "MappedToOtherFleet"), what="a")
            on_b = await eventually(with_reason(api, "b", "ModelConflict", "Mapped", OTHER_NS), what="b")
            assert on_a["status"] == on_b["status"] == "False"
            assert f"{OTHER_NS}/b" in on_a["message"]
            posted = events(api, "a") + events(api, "b", OTHER_NS)
            assert not any(m.startswith("ModelConflict (") for m in posted)

        # Without the mapping, the same two fleets conflict: the mapping above was what resolved it.
        async with running_operator(settings(kubeconfig, namespaces=[NS, OTHER_NS])):
            await eventually(with_reason(api, "a", "ModelConflict", "ModelServedByOtherFleets"),
                             what="conflict once unmapped")


def agent_images(api: KubeEmulator) -> set[str] | None:
    deploy = obj(api, DEPLOYMENTS, "tiny")
    if deploy is None:
        return None
    init = deploy["spec"]["template"]["spec"].get("initContainers") or []
    return {container(deploy, "agent")["image"], *(c["image"] for c in init if c["name"] == "fetch-model")}


async def test_an_upgraded_operator_renders_its_own_agent_for_fleets_that_name_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet stores no agent image; the operator's version gives it at render time, so a new
    operator version rolls the agents (agent sidecar and model download) to its own image."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        current = release.agent_image_for(release.installed_version())
        async with running_operator(settings(kubeconfig)):
            await create(api, fleet_manifest())
            assert await eventually(lambda: agent_images(api), what="deployment") == {current}
        assert "agentImage" not in (obj(api, FLEETS, "tiny") or {})["spec"]

        monkeypatch.setattr(release, "installed_version", lambda: "9.8.7")
        async with running_operator(settings(kubeconfig)):
            await eventually(lambda: agent_images(api) == {"llamafleet/llamafleet:9.8.7"},
                             what="the new operator's agent image")
        assert "agentImage" not in (obj(api, FLEETS, "tiny") or {})["spec"]
        assert not api.errors

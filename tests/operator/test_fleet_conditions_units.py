"""Pure parts: the fleet's conditions (stuck pods, model conflicts), the events they post, the agent image."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llamafleet_operator import release
from llamafleet_operator.reconcile.conflicts import claims, model_condition
from llamafleet_operator.reconcile.fleet import fleet_status, parse_fleet
from llamafleet_operator.reconcile.stuck import MESSAGE_CHARS, stuck
from llamafleet_operator.render import Target, render_all
from llamafleet_operator.settings import OperatorSettings
from llamafleet_operator.status import condition, transitions
from tests.operator.operator_bed import fleet_manifest

SCHEDULER = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def unschedulable(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}]}}


def init_crash_loop(name: str, message: str = "sha256 mismatch for tiny-qwen2.gguf") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "initContainerStatuses": [{
            "name": "fetch-model", "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message}},
        }],
    }}


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_unschedulable_pods_degrade_the_fleet_with_the_schedulers_message() -> None:
    """A pod no node fits is Degraded/Unschedulable with the scheduler's words, not `PodsStarting`."""
    pods = [unschedulable("a"), unschedulable("b")]
    status = fleet_status(parse_fleet(fleet_manifest(replicas=2)), pods, None)
    c = conds(status)
    assert status["phase"] == "Degraded"
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "Unschedulable")
    assert c["Degraded"]["message"] == f"a: {SCHEDULER}; b: {SCHEDULER}"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "PodsStuck")


def test_init_container_crash_loop_named_with_its_last_exit() -> None:
    status = fleet_status(parse_fleet(fleet_manifest(replicas=1)), [init_crash_loop("a")], None)
    degraded = conds(status)["Degraded"]
    assert degraded["reason"] == "InitCrashLoop"
    assert degraded["message"] == ("a: init container fetch-model keeps crashing, last exit: Error (code 1): "
                                   "sha256 mismatch for tiny-qwen2.gguf, 3 restarts")


def test_a_long_termination_message_keeps_its_last_line_cut() -> None:
    found = stuck(init_crash_loop("a", message="Traceback:\n  File x\nValueError: " + "y" * 500))
    assert found is not None and found.message.endswith("y..., 3 restarts")
    assert "Traceback" not in found.message and len(found.message) < MESSAGE_CHARS + 120


def test_different_reasons_give_pods_failing_with_every_pod_named() -> None:
    status = fleet_status(parse_fleet(fleet_manifest(replicas=2)), [unschedulable("a"), init_crash_loop("b")],
                          None)
    degraded = conds(status)["Degraded"]
    assert degraded["reason"] == "PodsFailing"
    assert degraded["message"].startswith(f"a: {SCHEDULER}; b: init container fetch-model keeps crashing")


def test_a_pod_being_scheduled_or_started_is_still_progressing() -> None:
    """Waiting for the scheduler (no verdict yet) or for a running init container is not Degraded."""
    pending = {"metadata": {"name": "a"}, "status": {"phase": "Pending"}}
    starting = {"metadata": {"name": "b"}, "status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "fetch-model", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
    status = fleet_status(parse_fleet(fleet_manifest(replicas=3)), [pending, starting, unschedulable("c")],
                          None)
    c = conds(status)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "PodsStarting")
    assert c["Degraded"]["reason"] == "Unschedulable" and c["Degraded"]["message"].startswith("c: ")


SERVED = {"llm/a": "qwen", "team-b/b": "qwen", "team-c/c": "qwen", "llm/other": "gemma"}


@pytest.mark.parametrize(("fleet", "model", "mapping", "expected"), [
    ("llm/a", "qwen", {}, ("True", "ModelServedByOtherFleets", "team-b/b, team-c/c")),
    ("team-b/b", "qwen", {}, ("True", "ModelServedByOtherFleets", "llm/a, team-c/c")),
    ("llm/other", "gemma", {}, ("False", "Unique", "")),
    ("team-b/b", "qwen", {"qwen": "team-b/b"}, ("False", "Mapped", "to this fleet")),
    ("llm/a", "qwen", {"qwen": "team-b/b"}, ("False", "MappedToOtherFleet", "team-b/b")),
    ("llm/other", "gemma", {"qwen": "team-b/b"}, ("False", "Unique", "")),
])
def test_model_conflict_names_the_other_fleets_unless_mapped(
        fleet: str, model: str, mapping: dict[str, str], expected: tuple[str, str, str]) -> None:
    cond = model_condition(fleet, model, SERVED, mapping)
    assert (cond["type"], cond["status"], cond["reason"]) == ("ModelConflict", *expected[:2])
    assert expected[2] in cond["message"]
    if cond["status"] == "True":
        assert fleet not in cond["message"], "a conflict names the other fleets, not this one"


def test_claims_leave_out_fleets_being_deleted() -> None:
    gone = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    fleets = [{"metadata": {"name": n, "namespace": ns, **extra}, "spec": {"model": {"name": "qwen"}}}
              for n, ns, extra in [("a", "llm", {}), ("b", "team-b", gone)]]
    assert claims(fleets) == {"llm/a": "qwen"}


def test_an_event_only_when_a_reported_condition_changes() -> None:
    """The timer writes the same conditions every tick: events come from changes only."""
    ok = [condition("Degraded", False, "AsExpected")]
    bad = [condition("Degraded", True, "Unschedulable", "a: no node")]
    worse = [condition("Degraded", True, "Unschedulable", "a: no node; b: no node")]
    types = ("Degraded", "ModelConflict")
    assert transitions(ok, bad, types) == [(True, "Degraded (Unschedulable): a: no node")]
    assert transitions(bad, bad, types) == []
    assert transitions(bad, worse, types) == [(True, "Degraded (Unschedulable): a: no node; b: no node")]
    assert transitions(worse, ok, types) == [(False, "Degraded cleared (AsExpected)")]
    assert transitions(None, ok, types) == [] and transitions(ok, ok, types) == []


def test_operator_reads_model_fleets_as_the_gateway_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFLEET_OPERATOR_MODEL_FLEETS", "qwen=team-b/b, gemma=llm/other")
    assert OperatorSettings().model_owners() == {"qwen": "team-b/b", "gemma": "llm/other"}
    monkeypatch.setenv("LLAMAFLEET_OPERATOR_MODEL_FLEETS", "qwen=team-b")
    with pytest.raises(ValidationError, match="namespace/name"):
        OperatorSettings()


def agent_images(target: Target, **spec: Any) -> set[str]:
    fleet = parse_fleet({**fleet_manifest(**spec), "metadata": {"name": "tiny", "uid": "u"}})
    (workload,) = [m for m in render_all(fleet, target) if m["kind"] == "Deployment"]
    pod = workload["spec"]["template"]["spec"]
    return {c["image"] for c in pod["containers"] + pod["initContainers"]
            if c["name"] in ("agent", "fetch-model")}


def test_a_fleet_without_agent_image_renders_the_operators_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stored default: the operator's own version picks the agent, so a new version renders a new one."""
    assert "agentImage" not in fleet_manifest()["spec"]
    assert parse_fleet(fleet_manifest()).spec.agent_image is None
    current = release.agent_image_for(release.installed_version())
    assert OperatorSettings().agent_image == current
    assert agent_images(Target(name="tiny", namespace="llm")) == {current}
    monkeypatch.setattr(release, "installed_version", lambda: "9.8.7+local")
    assert OperatorSettings().agent_image == "llamafleet/llamafleet:9.8.7-local"
    assert agent_images(Target(name="tiny", namespace="llm")) == {"llamafleet/llamafleet:9.8.7-local"}


@pytest.mark.parametrize(("spec_image", "expected"), [
    (None, "llamafleet/llamafleet:0.2.0"),
    ("llamafleet/llamafleet:0.1.0", "llamafleet/llamafleet:0.2.0"),  # what the old CRD stored as default
    ("registry.example/llamafleet:0.1.0", "registry.example/llamafleet:0.1.0"),
    ("llamafleet/llamafleet:0.1.1", "llamafleet/llamafleet:0.1.1"),
])
def test_a_chosen_agent_image_wins_over_the_operators(spec_image: str | None, expected: str) -> None:
    spec = {} if spec_image is None else {"agentImage": spec_image}
    assert agent_images(Target(name="tiny", namespace="llm", agent_image="llamafleet/llamafleet:0.2.0"),
                        **spec) == {expected}

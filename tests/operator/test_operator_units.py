"""Pure parts of the operator: conditions, fleet and prefix status, pod reads, the emulator's selectors."""

from __future__ import annotations

from typing import Any

import pytest

from llamafleet_core.warming import PodWarmState, WarmResult
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import InvalidSpec
from llamafleet_operator.reconcile.fleet import fleet_status, parse_fleet
from llamafleet_operator.reconcile.prefix import parse_prefix
from llamafleet_operator.reconcile.prefix_status import prefix_status
from llamafleet_operator.reconcile.readiness import FleetPrefix, required_set, snapshot_of
from llamafleet_operator.status import condition, merge
from tests.operator.kmock_support import matches
from tests.operator.operator_bed import fleet_manifest


def pod(name: str, *, ready: bool = False, phase: str = "Running",
        waiting: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "podIP": "10.0.0.1", "startTime": "2026-01-01T00:00:00Z",
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status["containerStatuses"] = [{"name": "llama-server", "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": status,
            "spec": {"containers": [
                {"name": "llama-server", "ports": [{"name": "http", "containerPort": 9}]}]}}


def test_condition_transition_time_kept_when_status_unchanged() -> None:
    """A reconcile that writes the same conditions again moves no lastTransitionTime (no spurious events)."""
    first = merge([], [condition("Ready", False, "A")], at="t1")
    again = merge(first, [condition("Ready", False, "B", "other reason")], at="t2")
    flipped = merge(again, [condition("Ready", True, "C")], generation=3, at="t3")
    assert again[0]["lastTransitionTime"] == "t1" and again[0]["reason"] == "B"
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["observedGeneration"] == 3


def test_fleet_status_ready_when_every_replica_ready() -> None:
    """READY counts ready pods against the desired count; slots are those of ready pods only."""
    fleet = parse_fleet({**fleet_manifest(replicas=2, slots=3), "metadata": {"name": "f", "generation": 4}})
    half = fleet_status(fleet, [pod("a", ready=True), pod("b")], None)
    assert (half["ready"], half["slots"], half["phase"]) == ("1/2", 3, "Progressing")
    assert half["observedGeneration"] == 4
    full = fleet_status(fleet, [pod("a", ready=True), pod("b", ready=True)], half)
    assert (full["ready"], full["slots"], full["phase"]) == ("2/2", 6, "Ready")
    assert {c["type"]: c["status"] for c in full["conditions"]} == {
        "Ready": "True", "Progressing": "False", "Degraded": "False"}


def test_fleet_status_degraded_when_a_pod_crash_loops() -> None:
    """A pod that will not recover by waiting makes the fleet Degraded, naming the pod and the reason."""
    fleet = parse_fleet(fleet_manifest(replicas=1))
    status = fleet_status(fleet, [pod("a", waiting="CrashLoopBackOff")], None)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert status["phase"] == "Degraded" and degraded["reason"] == "CrashLoopBackOff"
    assert degraded["message"] == "a: container llama-server keeps crashing"


@pytest.mark.parametrize(("spec", "field"), [
    ({"fleetRef": {"name": "f"}}, "messages: set messages, tools or text"),
    ({"fleetRef": {"name": "f"}, "text": "x", "messages": [{"content": "y"}]}, "text: exclusive"),
    ({"fleetRef": {"name": "Not_A_Name"}, "text": "x"}, "spec.fleetRef.name"),
])
def test_prefix_spec_rejected_with_field_named_when_invalid(spec: dict[str, Any], field: str) -> None:
    """An invalid SharedPrefix spec raises InvalidSpec whose message names the field."""
    with pytest.raises(InvalidSpec, match=field.replace(".", r"\.")):
        parse_prefix({"spec": spec})


def result(*states: PodWarmState, snapshot: str = "sp-p-0123456789ab") -> WarmResult:
    return WarmResult(snapshot, 100, "0123456789abcdef", 2048, 400, list(states), "m")


def test_prefix_status_degraded_when_pod_rejects_snapshot() -> None:
    """A fingerprint refusal is Degraded with reason PodRejectedSnapshot and the agent's own words."""
    res = result(PodWarmState("a", "warm", 100, 2048),
                 PodWarmState("b", "failed", message="pod rejected snapshot: fingerprint mismatch: n_slots"))
    status = prefix_status(res, 2, {})
    conds = {c["type"]: c for c in status["conditions"]}
    assert status["warm"] == "1/2" and status["phase"] == "Degraded"
    assert conds["Degraded"]["reason"] == "PodRejectedSnapshot"
    assert "b: pod rejected snapshot: fingerprint mismatch" in conds["Degraded"]["message"]
    assert conds["Ready"]["status"] == "False"
    assert status["pods"][1] == {"name": "b", "state": "Failed",
                                 "message": "pod rejected snapshot: fingerprint mismatch: n_slots"}


def test_prefix_status_warm_when_every_pod_holds_it() -> None:
    status = prefix_status(result(PodWarmState("a", "warm", 100, 2048)), 1, {})
    assert (status["phase"], status["warm"], status["tokens"], status["hash"]) == (
        "Warm", "1/1", 100, "0123456789abcdef")
    assert "lastWarmTime" in status


def test_required_set_leaves_out_prefixes_being_deleted() -> None:
    """Pods must not wait for a snapshot that is about to be removed, nor for one never warmed."""
    name = snapshot_of("p", "0123456789abcdef0123")
    assert name == "sp-p-0123456789ab"
    prefixes = [FleetPrefix("p", name, frozenset({"a"}), False),
                FleetPrefix("q", "sp-q-aaaaaaaaaaaa", frozenset({"a"}), True),
                FleetPrefix("r", None, frozenset(), False)]
    assert required_set(prefixes, ["a"]) == ["sp-p-0123456789ab"]


def test_pod_endpoints_read_from_named_ports() -> None:
    p = pod("a")
    assert P.ports(p) == (9, 8090)
    assert P.warm_pod(p).llama_url == "http://10.0.0.1:9"
    assert P.epoch_ms(p) == 1767225600000


@pytest.mark.parametrize(("selector", "expected"), [
    ("a=1", True), ("a==1,b", True), ("a!=1", False), ("!c", True), ("a in (1, 2)", True),
    ("a notin (1)", False), ("c", False),
])
def test_emulator_label_selector(selector: str, expected: bool) -> None:
    assert matches(selector, {"metadata": {"labels": {"a": "1", "b": "2"}}}) is expected


def test_operator_rejects_a_bad_redis_url_without_showing_its_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llamafleet_operator.cli import main

    monkeypatch.setenv("LLAMAFLEET_OPERATOR_REDIS_URL", "redis://:hunter2@r:6379/0?nope=1")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "redis_url" in err and "nope" in err and "hunter2" not in err

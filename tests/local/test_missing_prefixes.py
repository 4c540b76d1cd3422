"""What a pod must hold before `up` routes to it: every SharedPrefix the fleet has (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from llamafleet_core.warming import PodWarmState
from llamafleet_local.up.supervise import missing_prefixes


@dataclass
class Result:  # the part of `WarmResult` the rule reads
    pods: list[PodWarmState]


def result(**states: str) -> Result:
    return Result([PodWarmState(pod, state) for pod, state in states.items()])


def test_a_prefix_warm_on_a_peer_but_not_here_is_missing() -> None:
    results = {"tools": result(a="warm", b="failed"), "other": result(a="warm", b="warm")}
    assert missing_prefixes(results, "b") == ["tools"]
    assert missing_prefixes(results, "a") == []


def test_a_pending_copy_is_missing_too() -> None:
    assert missing_prefixes({"tools": result(a="warm", b="pending")}, "b") == ["tools"]


def test_a_prefix_warm_on_no_pod_holds_no_pod_back() -> None:
    results = {"too-long": result(a="failed", b="failed"), "tools": result(a="warm", b="warm")}
    assert missing_prefixes(results, "a") == missing_prefixes(results, "b") == []


def test_a_fleet_of_one_pod_needs_nothing_from_peers() -> None:
    assert missing_prefixes({"tools": result(a="failed")}, "a") == []

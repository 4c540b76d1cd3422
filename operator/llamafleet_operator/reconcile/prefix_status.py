"""SharedPrefix status from a warm result (pure): tokens, hash, bytes, WARM column, per-pod states.

Conditions:
- Ready: every running pod of the fleet holds the snapshot.
- Warming: some pod does not hold it yet and has not failed.
- Degraded: something will not fix itself by waiting, with the reason (`TemplateRenderFailed`,
  `PodRejectedSnapshot` with the agent's words such as "fingerprint mismatch", `SeedFailed`: no pod
  could build it, with when the next attempt runs, ...). A prefix with no snapshot is never required
  of any pod (readiness.py), so it only ever fails itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamafleet_core.warming import PodWarmState, WarmResult
from llamafleet_operator.status import condition, merge, now

STATES = {"warm": "Warm", "failed": "Failed", "pending": "Pending"}


def _degraded(result: WarmResult, note: str) -> dict[str, Any]:
    failed = [s for s in result.pods if s.state == "failed"]
    if not result.snapshot:
        message = "; ".join(f"{s.pod}: {s.message}" for s in failed) or "no pod could build the prefix"
        return condition("Degraded", True, "SeedFailed", f"{message}; {note}" if note else message)
    if not failed:
        return condition("Degraded", False, "AsExpected")
    message = "; ".join(f"{s.pod}: {s.message}" for s in failed)
    if any("rejected snapshot" in s.message for s in failed):
        return condition("Degraded", True, "PodRejectedSnapshot", message)
    return condition("Degraded", True, "PodsFailed", message)


def _pod(state: PodWarmState) -> dict[str, Any]:
    out: dict[str, Any] = {"name": state.pod, "state": STATES[state.state], "message": state.message}
    if state.tokens:
        out["tokens"] = state.tokens
    if state.bytes:
        out["bytes"] = state.bytes
    return out


def prefix_status(result: WarmResult, generation: int | None, previous: Mapping[str, Any], *,
                  note: str = "") -> dict[str, Any]:
    """`note`: when the next attempt runs, for a prefix that no pod could build (retry.py)."""
    warm, desired = result.warm, result.desired
    pending = sum(s.state == "pending" for s in result.pods)
    degraded = _degraded(result, note)
    all_warm = bool(result.snapshot) and warm == desired
    ready = condition("Ready", all_warm, "AllPodsWarm" if all_warm else "PodsNotWarm",
                      f"{warm} of {desired} pods warm")
    warming = condition("Warming", pending > 0, "PodsPending" if pending else "Idle",
                        f"{pending} pods waiting" if pending else "")
    phase = "Warm" if all_warm else "Degraded" if degraded["status"] == "True" else "Warming"
    status: dict[str, Any] = {
        "warmPods": warm,
        "desiredPods": desired,
        "warm": f"{warm}/{desired}",
        "pods": [_pod(s) for s in result.pods],
        "phase": phase,
        "observedGeneration": generation,
        "conditions": merge(previous.get("conditions"), [ready, warming, degraded], generation=generation),
    }
    if result.snapshot:
        status.update(tokens=result.tokens, hash=result.text_hash, bytes=result.bytes)
        if previous.get("hash") != result.text_hash or warm != previous.get("warmPods"):
            status["lastWarmTime"] = now()
    return status


def error_status(reason: str, message: str, generation: int | None, previous: Mapping[str, Any], *,
                 phase: str, degraded: bool = True) -> dict[str, Any]:
    conds = [condition("Ready", False, reason, message), condition("Warming", False, reason, message),
             condition("Degraded", degraded, reason if degraded else "AsExpected",
                       message if degraded else "")]
    return {"phase": phase, "observedGeneration": generation,
            "conditions": merge(previous.get("conditions"), conds, generation=generation)}

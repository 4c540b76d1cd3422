"""Why a pod cannot become ready by waiting, read from its status (pure).

A pod the scheduler cannot place, or whose init container crash-loops, stays Pending with no container
running, so a fleet that only counted ready pods stayed `Progressing: PodsStarting` forever. Each case
here has its own reason, and a message with what Kubernetes said (the scheduler's message, the last
exit of the container), so `kubectl get llamafleet` and the events say what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Pod = dict[str, Any]
# Container waiting reasons that will not resolve by waiting.
STUCK = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                   "InvalidImageName", "CreateContainerError"})
# A container's termination message can be long (a traceback): the condition keeps its last line, cut.
MESSAGE_CHARS = 200


@dataclass(frozen=True)
class Stuck:
    """One pod that cannot become ready by waiting: a condition reason and a message naming the pod."""

    reason: str
    message: str


def stuck(pod: Pod) -> Stuck | None:
    """The first thing that keeps `pod` from ever turning ready, or None when waiting may do."""
    name = str(pod["metadata"]["name"])
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return Stuck("PodFailed", f"{name}: {status.get('reason') or 'Failed'}"
                                  + (f" ({status['message']})" if status.get("message") else ""))
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return Stuck("Unschedulable", f"{name}: {scheduled.get('message') or 'no node fits the pod'}")
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        for cs in status.get(key) or []:
            found = _container(name, cs, init=init)
            if found is not None:
                return found
    return None


def _container(pod: str, cs: dict[str, Any], *, init: bool) -> Stuck | None:
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    if reason not in STUCK:
        return None
    what = f"{'init container' if init else 'container'} {cs.get('name')}"
    if reason == "CrashLoopBackOff":
        return Stuck("InitCrashLoop" if init else "CrashLoopBackOff",
                     f"{pod}: {what} keeps crashing{_last_exit(cs)}")
    detail = f" ({_short(waiting['message'])})" if waiting.get("message") else ""
    return Stuck(reason, f"{pod}: {what} {reason}{detail}")


def _last_exit(cs: dict[str, Any]) -> str:
    """`, last exit: Error (code 1): <message>, 4 restarts` from the container's last termination."""
    last = (cs.get("lastState") or {}).get("terminated") or {}
    parts = []
    if last:
        text = f"last exit: {last.get('reason') or 'terminated'} (code {last.get('exitCode', '?')})"
        if last.get("message"):
            text += f": {_short(last['message'])}"
        parts.append(text)
    if cs.get("restartCount"):
        parts.append(f"{cs['restartCount']} restarts")
    return "".join(f", {p}" for p in parts)


def _short(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= MESSAGE_CHARS else last[:MESSAGE_CHARS - 3] + "..."


def degraded_reason(found: list[Stuck]) -> str:
    """One reason for the fleet's Degraded condition: the pods' own when they share it."""
    reasons = {s.reason for s in found}
    return reasons.pop() if len(reasons) == 1 else "PodsFailing"

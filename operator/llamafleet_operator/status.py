"""Conditions in the shape of metav1.Condition, computed purely from the previous list.

`lastTransitionTime` moves only when a condition's status flips, so a level-based reconcile that writes
the same conditions every tick changes nothing (and wakes no watcher).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]
Cond = dict[str, Any]


def now() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: bool | Status, reason: str, message: str = "") -> Cond:
    value: Status = ("True" if status else "False") if isinstance(status, bool) else status
    return {"type": type_, "status": value, "reason": reason, "message": message}


def merge(previous: Iterable[Cond] | None, updates: Iterable[Cond], *, generation: int | None = None,
          at: str | None = None) -> list[Cond]:
    """The new conditions list: `updates` replace entries of the same type, the others stay.

    Each update keeps the previous `lastTransitionTime` when its status did not change.
    """
    old = {c.get("type"): c for c in previous or ()}
    stamp = at or now()
    out = dict(old)
    for cond in updates:
        before = old.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        new = dict(cond)
        new["lastTransitionTime"] = before.get("lastTransitionTime", stamp) if same and before else stamp
        if generation is not None:
            new["observedGeneration"] = generation
        out[cond["type"]] = new
    return [out[k] for k in sorted(out, key=str)]


def get(conditions: Iterable[Cond] | None, type_: str) -> Cond | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(conditions: Iterable[Cond] | None, type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"

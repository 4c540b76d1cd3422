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


def transitions(previous: Iterable[Cond] | None, current: Iterable[Cond],
                types: Iterable[str]) -> list[tuple[bool, str]]:
    """(bad, line) for each of `types` that turned True or changed while True (bad), or turned False
    from True: the lines worth an event; a condition that says the same as before gives none."""
    out = []
    for type_ in types:
        new, old = get(current, type_), get(previous, type_)
        if new is None or (old is not None and all(old.get(k) == new.get(k)
                                                    for k in ("status", "reason", "message"))):
            continue
        if new.get("status") == "True":
            out.append((True, f"{type_} ({new.get('reason')}): {new.get('message')}"))
        elif old is not None and old.get("status") == "True":
            detail = f": {new['message']}" if new.get("message") else ""
            out.append((False, f"{type_} cleared ({new.get('reason')}){detail}"))
    return out

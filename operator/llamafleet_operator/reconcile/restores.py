"""Whether a fleet's pods reuse restored snapshots, as their agents probed it (agent/restore_check.py).

On a sliding-window model upstream llama-server computes a restored slot's whole prompt again, so the
gateway turns restores off for such pods by itself (it reads the agent's `/ready`). The operator says so
where a user looks: `status.restores` and the `RestoresOff` condition, with the agent's reason (an event
on each change). SharedPrefixes still warm (the head is computed once and held in a slot, which the
gateway routes to), but their snapshots are not restored on these pods. A fleet none of whose asked pods
answered keeps the last record, as the slot context does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamafleet_operator.status import Cond, condition

TYPE = "RestoresOff"


def probed(answers: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(state, reason) of the agents' probes (pure): `unusable` if any pod found it, `reusable` if one
    did and none found otherwise, None while no pod has a result (older agents report none)."""
    results = [a["restores"] for a in answers if isinstance(a.get("restores"), Mapping)]
    done = [(str(r.get("state")), str(r.get("reason", ""))) for r in results
            if r.get("state") in ("reusable", "unusable")]
    return next((d for d in done if d[0] == "unusable"), done[0] if done else None)


def restores_condition(state: str | None, reason: str) -> Cond | None:
    """`RestoresOff` for a probe's result (pure); None while nothing is known."""
    if state is None:
        return None
    if state == "unusable":
        return condition(TYPE, True, "NotReusedByServer",
                         f"{reason}. Slot locality still routes sessions to the slots holding their "
                         "prefix; a llama-server that keeps context checkpoints in its slot files (the "
                         "project's patched build) or --swa-full make restores work")
    return condition(TYPE, False, "Reused", reason)

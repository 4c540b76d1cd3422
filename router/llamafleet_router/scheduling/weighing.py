"""Weighing: the scorers' answers combined into one total per slot candidate (pure).

Split from the scheduler so that the arithmetic every decision runs (and that the scoring tests pin)
stands on its own. Pod-level answers are weighed once per pod and copied to that pod's candidates;
slot-level answers are added per candidate only when some scorer gave a slot a non-zero score (with
1,000 index entries, per-candidate dict lookups of all-zero answers were most of a decision's cost).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import Candidate, ScoredCandidate, clamp01

K = TypeVar("K")


def weigh_candidates(
    candidates: Sequence[Candidate],
    pod_level: Sequence[tuple[str, float, Mapping[str, float]]],
    slot_level: Sequence[tuple[str, float, Mapping[SlotRef, float]]],
    zero: Mapping[str, float],
) -> list[ScoredCandidate]:
    """Each candidate with its weighted total and its per-scorer (clamped) scores. `pod_level` answers
    are keyed by pod uid, `slot_level` ones by slot; `zero` names the scorers that gave 0 everywhere
    (or did not apply), so that every candidate reports every scorer."""
    per_pod: dict[str, tuple[float, dict[str, float]]] = {}
    scored = []
    for c in candidates:
        key = c.key
        base = per_pod.get(key.pod_uid)
        if base is None:
            base = per_pod[key.pod_uid] = _weigh(pod_level, key.pod_uid, 0.0, dict(zero))
        total, per = base[0], dict(base[1])
        if slot_level:
            total, per = _weigh(slot_level, key, total, per)
        scored.append(ScoredCandidate(c, total, per))
    return scored


def _weigh(
    answers: Sequence[tuple[str, float, Mapping[K, float]]], key: K, total: float, per: dict[str, float]
) -> tuple[float, dict[str, float]]:
    """Add each scorer's clamped score of `key` to `per` and its weighted value to `total`."""
    for name, weight, scores in answers:
        value = _clamped(scores.get(key, 0.0))
        per[name] = value
        total += weight * value
    return total, per


def weighted_total(answers: Sequence[tuple[str, float, Mapping[K, float]]], key: K) -> float:
    """The weighted total of `key`'s clamped scores, without the per-scorer record (`_weigh`'s sum)."""
    return sum(weight * _clamped(scores.get(key, 0.0)) for _, weight, scores in answers)


def _clamped(value: float) -> float:
    return value if 0.0 <= value <= 1.0 else clamp01(value)  # out of range or NaN


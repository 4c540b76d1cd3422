"""Weighing: the scorers' answers combined into one total per slot candidate (pure).

Split from the scheduler so that the arithmetic every decision runs (and that the scoring tests pin)
stands on its own. Pod-level answers are weighed once per pod and copied to that pod's candidates;
slot-level answers are added per candidate only when some scorer gave a slot a non-zero score (with
1,000 index entries, per-candidate dict lookups of all-zero answers were most of a decision's cost).
Before weighing, a scheduler whose picker ranks by total and then pod uid can drop the candidates that
could not be among the few it tries (`best_alike`).
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


# Pod-level totals this close are not surely ordered when pruning: pickers round totals to 9 digits,
# and the pod uid then decides.
TIE = 1e-8


def best_alike(
    candidates: Sequence[Candidate],
    pod_level: Sequence[tuple[str, float, Mapping[str, float]]],
    slot_level: Sequence[tuple[str, float, Mapping[SlotRef, float]]],
    keep: int,
) -> list[Candidate]:
    """The candidates that a picker ranking by total, then pod uid (`OrderedPicker`), could put among
    its first `keep` (pure): per group of candidates that every slot-level scorer scores alike, those
    that fewer than `keep` of their group surely rank before.

    Within a group the slot-level scores add the same values in the same order to each pod-level
    total, so totals keep the pod-level order, and equal pod-level totals stay equal (the pod uid
    decides). A prefix held across a large fleet names hundreds of slots that score alike, most of
    them on idle pods whose totals tie; weighing and ordering them all was most of a decision at the
    99th percentile (docs/design.md, "Gateway process")."""
    if len(candidates) <= keep:
        return list(candidates)
    pod_totals: dict[str, float] = {}
    groups: dict[tuple[float, ...], list[tuple[float, str, Candidate]]] = {}
    for c in candidates:
        uid = c.key.pod_uid
        total = pod_totals.get(uid)
        if total is None:
            total = pod_totals[uid] = weighted_total(pod_level, uid)
        alike = tuple(_clamped(scores.get(c.key, 0.0)) for _, _, scores in slot_level)
        groups.setdefault(alike, []).append((total, uid, c))
    kept: list[Candidate] = []
    for members in groups.values():
        kept.extend(_not_surely_behind(members, keep) if len(members) > keep else (c for *_, c in members))
    return kept


def _not_surely_behind(members: list[tuple[float, str, Candidate]], keep: int) -> list[Candidate]:
    """Of one group's (pod-level total, pod uid, candidate), those with fewer than `keep` members
    surely ahead: a total more than `TIE` higher, or the same total and a smaller uid. (A total
    within `TIE` may round either way, and two slots of one pod are ordered by the picker's own
    rule: neither is sure.)"""
    members.sort(key=lambda m: (-m[0], m[1]))
    out: list[Candidate] = []
    above = run = same_uid = 0  # members[:above] are surely above; the run of equal totals, its uid
    for i, (total, uid, c) in enumerate(members):
        while members[above][0] > total + TIE:
            above += 1
        if members[run][0] != total:
            run = same_uid = i
        elif members[same_uid][1] != uid:
            same_uid = i
        if above + (same_uid - run) < keep:
            out.append(c)
    return out


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


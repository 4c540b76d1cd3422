"""Which slots a picker of fixed order could place first: the candidates of the others are never built
(pure functions of the pod rows, the lookup's groups and the pods singled out).

With a picker that ranks by total and then pod uid (`OrderedPicker`), placement tries the first `keep`
of the ranking at most. Candidates that every slot-level scorer scores alike add the same slot-level
values to their pods' pod-level totals, so among themselves they rank as their pods do, and of each
such bucket only its contenders can be among the first `keep`: the rest need no candidate, no slot-level
score and no weighing. By the slot-level scorers' contract (`framework.Scorer`) the buckets are:

- the representative slot of a pod nothing is known about, or the slot nothing is known about of a pod
  the lookup names (the "no prefix here" choice): bucket (pod kind, 0);
- the slots of one group (one run length, and whether they hold the head exactly: `candidates.
  slot_groups`) on pods of one kind: bucket (pod kind, group).

The pods singled out get all their candidates (`candidates.candidates`): a pod holding a snapshot of the
prompt (restoring there is local), a pod holding a nominated slot or the conversation's slot (the
session's pod scores above its other slots), and a pod whose slots share what the pod holds (a
--slot-attach pod, a --cache-prefix pod's RAM entries): there a slot's score depends on the pod's other
slots too. The few that remain are pruned exactly by `weighing.best_alike` once they are scored.

A prefix that the agents of a large fleet share is held on hundreds of pods: building, scoring and
grouping a candidate on each of them before all but a few were dropped was the 99th percentile of a
decision at 1,000 pods (docs/design.md, "Scheduling").
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Callable, Mapping, Sequence

from llamafleet_router.scheduling.candidates import SHARING_KINDS, Groups, candidates, oldest
from llamafleet_router.scheduling.framework import Candidate
from llamafleet_router.scheduling.pod_rows import PodRow, PodRows
from llamafleet_router.scheduling.weighing import TIE

_ORDER, _UID = operator.attrgetter("order"), operator.attrgetter("uid")
_FIRST = operator.itemgetter(0)


def pruned_candidates(
    rows: Sequence[PodRow], groups: Groups, singled: set[str], keep: int, *, idle_only: bool,
    extra_total: Callable[[str], float] | None = None, ranking: tuple[PodRows, str] | None = None,
) -> list[Candidate]:
    """The candidates of the pods of `rows` that a picker of fixed order could rank among its first
    `keep`: every candidate of the pods `singled` out or whose kind shares slots (`SHARING_KINDS`),
    and of each bucket of alike candidates its contenders (`contenders`), by the pods' weighted
    pod-level totals (the row's pod-local total, plus `extra_total` of the uid for pod-level scorers
    that read the request). Idle slots only when `idle_only`, else every slot (queueing).

    With `ranking` (the pod rows `rows` came from, and the model every one of them serves), the
    pods nothing is known about are read best first from the rows' kept ranking (`PodRows.ranked`)
    instead of ranked anew: at 1,000 pods, splitting and ranking them was a fifth of a decision."""
    if extra_total is not None:
        rows = [row.with_total(row.total + extra_total(row.uid)) for row in rows]
        ranking = None  # the totals are the request's own
    known = groups.keys() | singled
    pool: list[PodRow] = []  # the pods with a slot nothing is known about
    if ranking is None:
        named: list[PodRow] = []
        for row in rows:  # one loop: two comprehensions reading every uid took twice as long
            (named if row.uid in known else pool).append(row)
    else:
        by_uid, current = ranking[0].by_uid, set(rows)  # rows hash by identity
        named = [found for uid in known if (found := by_uid.get(uid)) in current]
    out: list[Candidate] = []
    buckets: dict[tuple[int, int], list[PodRow]] = {}
    for row in named:
        s, uid = row.state, row.uid
        if row.kind & SHARING_KINDS or uid in singled:
            out.extend(candidates((s,), groups, idle_only=idle_only))
            continue
        mine, n = groups[uid], s.endpoint.n_slots
        busy = s.busy_slots if idle_only else ()
        if len(mine) == 1:  # at fleet scale a pod the lookup names mostly holds the prompt in one slot
            ((slot, group),) = mine.items()
            named_slots = 1 if 0 <= slot < n and slot not in busy else 0
            if named_slots:
                buckets.setdefault((row.kind, group), []).append(row)
        else:
            eligible = [group for slot, group in mine.items() if 0 <= slot < n and slot not in busy]
            for group in set(eligible):
                buckets.setdefault((row.kind, group), []).append(row)
            named_slots = len(eligible)
        if (len(s.idle_slots) if idle_only else n) > named_slots:  # a slot the lookup does not name
            pool.append(row)
    for (_, group), pods in buckets.items():
        out.extend(_representative(row, groups[row.uid], group, idle_only) for row in contenders(pods, keep))
    if ranking is None:
        kinds = dict.fromkeys([row.kind for row in pool])  # in order of first sight: a stable output
        by_kind = ((pool if len(kinds) == 1 else [row for row in pool if row.kind == kind]) for kind in kinds)
    else:  # `pool` holds the named pods' rows only: the others are read from the ranking
        book, model = ranking
        by_kind = ([*_ranked_contenders(orders, book.by_uid, current, known, keep),
                    *(row for row in pool if row.kind == kind)] for kind, orders in book.ranked(model))
    for pods in by_kind:
        out.extend(_representative(row, groups.get(row.uid, {}), None, idle_only)
                   for row in contenders(pods, keep))
    return out


def _ranked_contenders(orders: Sequence[tuple[float, str]], by_uid: Mapping[str, PodRow],
                       current: set[PodRow], known: set[str], keep: int) -> list[PodRow]:
    """`contenders` of the rows that `orders` (best first) name, of those in `current` (by identity)
    and not `known`, read from the best: the first `keep`, and past them, only where a total within
    `TIE` may join them, those down to `TIE` below the lowest of theirs."""
    best: list[PodRow] = []
    for _, uid in orders:
        if uid not in known and (row := by_uid[uid]) in current:
            best.append(row)
            if len(best) == keep:
                break
    else:
        return best  # fewer than `keep`: all of them
    low = best[-1].total
    below, end = (bisect.bisect_right(orders, edge, key=_FIRST) for edge in (-low, TIE - low))
    if not any(low < row.total <= low + TIE for row in best) and not any(
            uid not in known and by_uid[uid] in current for _, uid in orders[below:end]):
        return best
    near = [row for _, uid in orders[:end] if uid not in known and (row := by_uid[uid]) in current]
    return contenders(near, keep)


def _representative(row: PodRow, mine: dict[int, int], group: int | None, idle_only: bool) -> Candidate:
    """The candidate of the pod's slots in `group` of `mine` (the lookup's groups of the pod's slots;
    None: the slots it does not name): the one released longest ago, idle ones only when `idle_only`.
    The caller knows there is one."""
    s = row.state
    slots = s.idle_slots if idle_only else range(s.endpoint.n_slots)
    if group is None:
        slot = oldest(s, (slot for slot in slots if slot not in mine))
    else:
        slot = oldest(s, (slot for slot in slots if mine.get(slot) == group))
    assert slot is not None, "a bucket holds only pods with a slot of its group"
    return Candidate(s, slot)


def contenders(pods: list[PodRow], keep: int) -> list[PodRow]:
    """Of pods whose candidates score alike, those that fewer than `keep` of the others are surely
    ranked before (pure): with a pod-level total more than `weighing.TIE` higher (within it, a
    picker's rounding may order them either way), or the same total and a smaller uid.

    The best `keep` by (total, uid) are contenders, and every pod with a higher total than the lowest
    of theirs is among them. So only pods within `TIE` below that lowest total may join them, and
    then only where a total within `TIE` above theirs leaves fewer than `keep` surely before: when
    the best totals are apart or equal and none lies just below (the usual case: idle pods alike),
    the best `keep` are all."""
    if len(pods) <= keep:
        return pods
    best = heapq.nsmallest(keep, pods, key=_ORDER)
    low = best[-1].total
    if not any(low < row.total <= low + TIE for row in best) and \
            not any(low - TIE <= total < low for total in {row.total for row in pods}):  # few distinct totals
        return best
    by_total: dict[float, list[PodRow]] = {}
    for row in pods:
        if row.total >= low - TIE:
            by_total.setdefault(row.total, []).append(row)
    out: list[PodRow] = []
    for total, alike in by_total.items():
        room = keep - sum(row.total > total + TIE for row in best)  # all surely before are among `best`
        if room > 0:
            out.extend(alike if len(alike) <= room else heapq.nsmallest(room, alike, key=_UID))
    return out

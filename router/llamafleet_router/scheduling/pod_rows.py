"""What the scheduler knows of each pod before it reads the request: the pod's kind and the scores of
its pod-local scorers (`PodLocalScorer`), kept with the pod's view from one request to the next.

The router keeps each pod's `EndpointState` until a request begins or ends on the pod or discovery
replaces it (fleet/state.py), so between two requests only the few pods that changed have a new view.
Scoring every pod's queue and free slots again per request, and weighing and ranking each pod by them
(`pruning.py`), was a large part of a decision at fleet scale (docs/design.md,
"Gateway process"); a row per view makes that one dict read per pod and a few scorer calls per
request. The rows also keep their pods ranked, per model and pod kind, as they come and go (`ranked`),
so that a request reads the best pods nothing is known about from the front (`pruning.py`).

A row is found by its view's own number (`EndpointState.view`), which no other view has: a changed pod
comes with a new view, so a stale row can never be read for it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from llamafleet_router.scheduling.candidates import pod_kind
from llamafleet_router.scheduling.framework import EndpointState, PodLocalScorer, clamp01

# Rows kept at the least (pods of every model the scheduler serves; a restarted pod has a new uid): they
# grow to twice the most endpoints of one request, so that a larger fleet does not forget its own rows.
_TRACKED_PODS = 4096

# report(plugin_type, plugin_name, started): the scheduler's per-plugin latency.
Report = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True, eq=False)
class PodRow:
    """One pod's view with what every request would compute of it alike. Compared and hashed by
    identity: a request's rows are a set in C (`pruning.py`), and each row stands for one view."""

    state: EndpointState
    uid: str
    kind: int  # `candidates.pod_kind`
    scores: tuple[float, ...]  # each pod-local scorer's clamped score, in the order given to `PodRows`
    total: float  # their weighted sum
    order: tuple[float, str]  # (-total, uid): how a picker of fixed order ranks pods whose slots score alike

    def with_total(self, total: float) -> PodRow:
        """The row with another total (pod-level scores that the request adds), not kept."""
        return PodRow(self.state, self.uid, self.kind, self.scores, total, (-total, self.uid))


class PodRows:
    """Rows of the pods the scheduler has seen, one per current view (not thread-safe: the router's
    event loop alone calls it, and `refresh` and the reads that follow run without an await)."""

    def __init__(self, scorers: Sequence[tuple[PodLocalScorer, str, str, float]]) -> None:
        """`scorers`: (scorer, its type name, its name, its weight) of each pod-local scorer."""
        self._scorers = tuple(scorers)
        self._rows: dict[str, PodRow] = {}
        # The same rows by their views' numbers (`EndpointState.view`): a request's rows are found
        # with one read per view (reading each view's uid and checking the row's view took 2.5 times
        # as long).
        self._by_view: dict[int, PodRow] = {}
        # Per (model, pod kind): the orders of its rows, best first, kept sorted as rows come and go,
        # so that a request finds the best pods of a kind without ranking the fleet (`pruning.py`).
        self._ranked: dict[tuple[str, int], list[tuple[float, str]]] = {}

    def refresh(self, endpoints: Sequence[EndpointState], report: Report | None = None) -> list[PodRow]:
        """The rows of `endpoints`, in their order, those of new views computed now."""
        rows, by_view = self._rows, self._by_view
        out = [by_view.get(s.view) for s in endpoints]
        stale = [i for i, row in enumerate(out) if row is None]
        if stale:
            columns = []
            for scorer, type_name, name, _ in self._scorers:
                started = time.perf_counter()
                columns.append([clamp01(scorer.score_pod(endpoints[i])) for i in stale])
                if report is not None:
                    report(type_name, name, started)
            weights = [weight for *_, weight in self._scorers]
            room = max(_TRACKED_PODS, 2 * len(endpoints))
            for n, i in enumerate(stale):
                s = endpoints[i]
                uid = s.endpoint.pod.uid
                scores = tuple(column[n] for column in columns)
                total = sum(w * v for w, v in zip(weights, scores, strict=True))
                # A pod's new row goes last (the newest), and when the rows are full the row kept
                # longest goes: pods come and go.
                if (was := rows.pop(uid, None)) is None and len(rows) >= room:
                    was = rows.pop(next(iter(rows)))
                if was is not None:
                    del by_view[was.state.view]
                    self._unrank(was)
                row = PodRow(s, uid, pod_kind(s.endpoint), scores, total, (-total, uid))
                rows[uid] = by_view[s.view] = out[i] = row
                bisect.insort(self._ranked.setdefault((s.endpoint.model, row.kind), []), row.order)
        return out  # type: ignore[return-value]  # every None was replaced above

    def _unrank(self, row: PodRow) -> None:
        key = (row.state.endpoint.model, row.kind)
        orders = self._ranked[key]
        del orders[bisect.bisect_left(orders, row.order)]
        if not orders:
            del self._ranked[key]

    def ranked(self, model: str) -> Iterator[tuple[int, Sequence[tuple[float, str]]]]:
        """Per kind of `model`'s pods: the orders (`PodRow.order`) of the rows kept, best first, every
        row's, not only those of the last `refresh` (valid until the next `refresh`)."""
        return ((kind, orders) for (of, kind), orders in self._ranked.items() if of == model)

    @property
    def by_uid(self) -> Mapping[str, PodRow]:
        """The rows kept, by pod uid: each pod's latest (valid until the next `refresh`)."""
        return self._rows

    def column(self, position: int) -> Mapping[str, float]:
        """The scores of the `position`-th pod-local scorer, by pod uid, as the weighing reads a
        pod-level answer (valid until the next `refresh`)."""
        return _Column(self._rows, position)


class _Column(Mapping[str, float]):
    """One scorer's scores of the rows, read through: no dict of every pod is built per request."""

    __slots__ = ("_position", "_rows")

    def __init__(self, rows: dict[str, PodRow], position: int) -> None:
        self._rows, self._position = rows, position

    def __getitem__(self, uid: str) -> float:
        return self._rows[uid].scores[self._position]

    def get(self, uid: str, default: float | None = None) -> float | None:  # type: ignore[override]
        row = self._rows.get(uid)
        return default if row is None else row.scores[self._position]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


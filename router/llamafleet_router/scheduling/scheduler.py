"""The scheduler: a thin runner over its plugins, returning one leased `Decision` per request.

    producers (I/O, once) -> filters (in order) -> slot candidates (per surviving pod: the idle slots
      the lookup or a plugin names, plus one representative idle slot; candidates.py; with a picker
      of fixed order only those it could place, pruning.py)
      -> weighted scorers (each clamped to [0, 1], times its weight, summed) -> picker (ranked list)
      -> placement (placement.py: the best slot whose lease is free) -> decider (action.py: its action)

Fallbacks, none of which fails the request:
- the index is down: `prefix-lookup` says so and the degraded hash steers (branch `degraded_hash`, or
  `session_affinity` when the session's previous slot won); the action is DIRECT, since nothing is known;
- a slot's lease is held by another router replica: try the next candidate (at most `leases.max_attempts`);
- no idle slot, or every lease taken: a `queued` decision without a lease (placement.py);
- the lease store raises (Redis down): proceed without a lease.
Only an empty endpoint set after a filter (nothing healthy, unknown model) raises `NoEndpointError`.

Per-plugin latency goes to an optional `metrics_hook(point, plugin_type, name, seconds)`, so the app
wires Prometheus without this module importing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.action import ActionDecider
from llamafleet_router.scheduling.candidates import Groups, candidates, singled_pods, slot_groups
from llamafleet_router.scheduling.config import PipelineConfig
from llamafleet_router.scheduling.framework import (
    INDEX_AVAILABLE,
    LOOKUP,
    NO_LOOKUP,
    RESTORE_ENABLED,
    Candidate,
    CycleState,
    Decision,
    DecisionHook,
    EndpointState,
    Filter,
    GatedScorer,
    MetricsHook,
    NoEndpointError,
    OrderedPicker,
    Picker,
    PluginHandle,
    PodLocalScorer,
    PodScorer,
    PrefixIndexLike,
    Producer,
    SchedRequest,
    ScoredCandidate,
    Scorer,
    SlotLeasesLike,
    SlotNominator,
)
from llamafleet_router.scheduling.placement import Placement, queued_decision
from llamafleet_router.scheduling.plugins.filters.model import ModelFilter
from llamafleet_router.scheduling.plugins.scorers.session_affinity import SessionAffinityScorer
from llamafleet_router.scheduling.pod_rows import PodRows
from llamafleet_router.scheduling.pruning import pruned_candidates
from llamafleet_router.scheduling.registry import Registry, register_builtin_plugins
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.scheduling.weighing import best_alike, weigh_candidates, weighted_total

log = logging.getLogger(__name__)


@dataclass
class Plugins:
    """A profile's plugins, built and sorted by kind, in the config's order."""

    producers: list[Producer] = field(default_factory=list)
    filters: list[Filter] = field(default_factory=list)
    scorers: list[tuple[Scorer, float]] = field(default_factory=list)
    pickers: list[Picker] = field(default_factory=list)
    hooks: list[DecisionHook] = field(default_factory=list)  # plugins that learn from decisions
    produces: dict[str, tuple[str, ...]] = field(default_factory=dict)  # producer name -> its state keys

    @property
    def picker(self) -> Picker:
        return self.pickers[0]  # the config guarantees exactly one


def build_plugins(config: PipelineConfig, registry: Registry, handle: PluginHandle) -> Plugins:
    """Build every plugin of the config's profile from `registry`."""
    out = Plugins()
    for entry in config.profile.plugins:
        pc = config.plugin(entry.ref)
        spec = registry[pc.type]
        plugin = spec.factory(pc.ref_name, pc.params, handle)
        out.produces[pc.ref_name] = spec.produces
        # Dispatch on the kind the registry declares (what the config was validated against), and
        # check the built object really implements it.
        if spec.kind == "producer" and isinstance(plugin, Producer):
            out.producers.append(plugin)
        elif spec.kind == "filter" and isinstance(plugin, Filter):
            out.filters.append(plugin)
        elif spec.kind == "scorer" and isinstance(plugin, Scorer):
            out.scorers.append((plugin, float(entry.weight or 0.0)))
        elif spec.kind == "picker" and isinstance(plugin, Picker):
            out.pickers.append(plugin)
        else:
            raise TypeError(f"plugin {pc.ref_name!r} does not implement the {spec.kind} protocol")
        if isinstance(plugin, DecisionHook):
            out.hooks.append(plugin)
    return out


class Scheduler:
    def __init__(
        self,
        config: PipelineConfig,
        *,
        index: PrefixIndexLike | None,
        leases: SlotLeasesLike | None,
        holder_prefix: str,
        metrics_hook: MetricsHook | None = None,
        registry: Registry | None = None,
        speeds: SpeedBook | None = None,
        score_every_pod: bool = False,
    ) -> None:
        """`score_every_pod`: build and score a candidate of every pod, as with a random picker (the
        reference the pruning (`pruning.py`) is checked and measured against)."""
        self.config = config
        # What the action choice weighs per pod: learned from the answers the app feeds it (hooks.py).
        self.speeds = speeds if speeds is not None else (
            SpeedBook(config.decision) if config.decision.learn_speeds else None)
        self._metrics = metrics_hook
        plugins = build_plugins(config, registry or register_builtin_plugins(), PluginHandle(index=index))
        self.producers, self.filters, self.scorers = plugins.producers, plugins.filters, plugins.scorers
        self._hooks, self._produces = plugins.hooks, plugins.produces
        self.picker = plugins.picker
        affinity = [s.name for s, _ in self.scorers if isinstance(s, SessionAffinityScorer)]
        self.decider = ActionDecider(config.decision, self.speeds, affinity)
        self.placement = Placement(leases, config.leases, holder_prefix, self.decider, self._report)
        self._nominators = [s for s, _ in self.scorers if isinstance(s, SlotNominator)]
        # How to ask each scorer, decided once (isinstance on a Protocol is slow): a pod-local scorer by
        # its column of the pod rows, a pod-level one once per request, the others per candidate.
        # A gated scorer is asked per request whether it applies, so it never joins a row's total.
        local = [(s, w) for s, w in self.scorers
                 if isinstance(s, PodLocalScorer) and not isinstance(s, GatedScorer)]
        self._rows = PodRows([(s, s.type_name, s.name, w) for s, w in local])
        column = {id(s): i for i, (s, _) in enumerate(local)}
        self._plan: list[tuple[Scorer, float, int | None, PodScorer | None, GatedScorer | None]] = [
            (s, w, column.get(id(s)), s if isinstance(s, PodScorer) else None,
             s if isinstance(s, GatedScorer) else None)
            for s, w in self.scorers
        ]
        self._prunes = (not score_every_pod and isinstance(self.picker, OrderedPicker)
                        and self.picker.orders_ties_by_pod)
        self._keep = config.leases.max_attempts  # the most candidates placement tries
        # Every ranked pod serves the request's model: the pods nothing is known about may then be read
        # from the pod rows' ranking of that model's pods (`pruning.py`).
        self._one_model = any(f.type_name == ModelFilter.type_name for f in self.filters)

    # ---- the pipeline ------------------------------------------------------------------------

    async def schedule(self, req: SchedRequest, endpoints: Sequence[EndpointState]) -> Decision:
        state = CycleState()
        state.write(RESTORE_ENABLED, self.config.decision.restore_enabled)
        clock = time.perf_counter
        for producer in self.producers:
            started = clock()
            try:
                await producer.prepare(req, state, endpoints)
            except Exception:  # a producer is I/O: log it and route on what we have
                log.exception("producer %r failed; scheduling without its data", producer.name)
                if INDEX_AVAILABLE.name in self._produces.get(producer.name, ()):
                    state.write(INDEX_AVAILABLE, False)
            self._report("producer", producer.type_name, producer.name, started)
        survivors = list(endpoints)
        for f in self.filters:
            started = clock()
            survivors = f.filter(req, state, survivors)
            self._report("filter", f.type_name, f.name, started)
            if not survivors:
                raise NoEndpointError(f"no endpoint for model {req.model!r} left after filter {f.name!r}")
        if not survivors:
            raise NoEndpointError(f"no endpoint for model {req.model!r}")
        lookup = state.read(LOOKUP, NO_LOOKUP)
        nominated = [ref for n in self._nominators for ref in n.nominate(req, state)]
        named = slot_groups(lookup, nominated)
        # With a picker of fixed order, only the slots it could place are built, once their pods'
        # pod-level scores are known (`rank`, pruning.py).
        prune = (named, singled_pods(lookup, nominated)) if self._prunes and len(survivors) > self._keep \
            else None
        decision = None
        roomy = [s for s in survivors if s.idle_slots]
        if roomy:
            idle = [] if prune else candidates(roomy, named, idle_only=True)
            ranked = self.rank(req, state, idle, roomy, prune=prune)
            decision = await self.placement.place(req, state, ranked, named)
        if decision is None:
            sized = [s for s in survivors if s.endpoint.n_slots > 0]
            every = [] if prune else candidates(sized, named, idle_only=False)
            ranked = self.rank(req, state, every, sized, prune=prune, idle_only=False)
            seen = lookup if state.read(INDEX_AVAILABLE, True) else None
            decision = queued_decision(req, seen, ranked, survivors, self.decider.is_session_slot)
        self.on_decision(req, decision)
        return decision

    def rank(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate],
        endpoints: Sequence[EndpointState] | None = None, *, prune: tuple[Groups, set[str]] | None = None,
        idle_only: bool = True,
    ) -> list[ScoredCandidate]:
        """Weighted scores of `candidates` (slots of `endpoints`, derived when not given), ranked best
        first by the picker.

        Pod-local scorers are asked once per view of a pod (`pod_rows.py`: a pod that did not change
        since the last request keeps its scores), other pod-level scorers once per pod of the request,
        gated scorers that do not apply are skipped, and a
        slot-level answer that is 0 everywhere is not looked up per candidate: with many index entries
        the per-candidate dict lookups would be most of the decision's cost. Given `prune` (the lookup's
        groups and the pods singled out, `pruning.py`), the candidates of `endpoints` that could be
        placed are added to `candidates` once their pods' pod-level scores are known
        (`pruned_candidates`), and of candidates that the slot-level scorers score alike only the best
        few are weighed and ranked (`best_alike`): then the first
        `keep` of the ranking, all that placement tries, are those of every candidate's ranking."""
        clock = time.perf_counter
        if endpoints is None:
            endpoints = list({id(c.state): c.state for c in candidates}.values())
        rows = self._rows.refresh(endpoints, self._report_scorer)
        zero: dict[str, float] = {}
        pod_level: list[tuple[str, float, Mapping[str, float]]] = []
        per_request: list[tuple[str, float, Mapping[str, float]]] = []  # pod-level, not pod-local
        slot_level: list[tuple[str, float, dict[SlotRef, float]]] = []
        by_slot: list[tuple[Scorer, float]] = []
        for scorer, weight, column, by_pod, gate in self._plan:
            if column is not None:  # scored (and reported) as its rows were refreshed
                pod_level.append((scorer.name, weight, self._rows.column(column)))
                continue
            started = clock()
            if gate is not None and not gate.applies(req, state):
                zero[scorer.name] = 0.0
            elif by_pod is not None:
                pod_level.append((scorer.name, weight, by_pod.score_pods(req, state, endpoints)))
                per_request.append(pod_level[-1])
            else:
                by_slot.append((scorer, weight))
                continue  # reported once it has scored the candidates, below
            self._report("scorer", scorer.type_name, scorer.name, started)
        if prune is not None:
            def extra_total(uid: str) -> float:
                return weighted_total(per_request, uid)
            groups, singled = prune
            candidates = [*candidates, *pruned_candidates(
                rows, groups, singled, self._keep, idle_only=idle_only,
                extra_total=extra_total if per_request else None,
                ranking=(self._rows, req.model) if self._one_model else None)]
        for scorer, weight in by_slot:
            started = clock()
            scores = scorer.score(req, state, candidates)
            if any(scores.values()):
                slot_level.append((scorer.name, weight, scores))
            else:
                zero[scorer.name] = 0.0
            self._report("scorer", scorer.type_name, scorer.name, started)
        if prune is not None:  # a picker of fixed order, which only the first `keep` it ranks matter of
            candidates = best_alike(candidates, pod_level, slot_level, self._keep)
        scored = weigh_candidates(candidates, pod_level, slot_level, zero)
        started = clock()
        ranked = self.picker.pick(req, state, scored)
        self._report("picker", self.picker.type_name, self.picker.name, started)
        return ranked

    # ---- around the pipeline -----------------------------------------------------------------

    def on_decision(self, req: SchedRequest, decision: Decision) -> None:
        """Tell plugins that learn from decisions (session affinity). `schedule` already calls it."""
        for hook in self._hooks:
            try:
                hook.on_decision(req, decision)
            except Exception:
                log.exception("on_decision hook failed")

    async def release(self, decision: Decision) -> None:
        """Release the decision's slot lease, if it took one. Never raises: the TTL is the backstop."""
        await self.placement.release(decision)

    def _report_scorer(self, plugin_type: str, name: str, started: float) -> None:
        self._report("scorer", plugin_type, name, started)

    def _report(self, point: str, plugin_type: str, name: str, started: float) -> None:
        """Per-plugin latency: one perf_counter pair per plugin, and nothing more without a hook."""
        if self._metrics is None:
            return
        try:
            self._metrics(point, plugin_type, name, time.perf_counter() - started)
        except Exception:
            log.exception("metrics hook failed")

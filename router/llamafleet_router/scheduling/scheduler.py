"""The scheduler: runs one profile per request and returns a leased `Decision`.

    producers (I/O, once) -> filters (in order) -> slot candidates (per surviving pod: the idle slots
      the lookup or a plugin names, plus one representative idle slot; see data.py)
      -> weighted scorers (each clamped to [0, 1], times its weight, summed) -> picker (ranked list)
      -> lease the best slot whose lease is free -> action choice (decide.py) -> Decision

Fallbacks, none of which fails the request:
- the index is down: `prefix-lookup` says so and the degraded hash steers (branch `degraded_hash`, or
  `session_affinity` when the session's previous slot won); the action is DIRECT, since nothing is known;
- a slot's lease is held by another router replica: try the next candidate (at most `leases.max_attempts`);
- no idle slot, or every lease taken: a `queued` decision without a lease for the best endpoint, pinned
  to its slot holding the most of the prefix (llama-server defers a pinned task until that slot frees;
  among slots holding it alike, the one with the fewest of this router's requests), or to any slot
  when none holds anything;
- the lease store raises (Redis down): proceed without a lease.
Only an empty endpoint set after a filter (nothing healthy, unknown model) raises `NoEndpointError`.

Per-plugin latency goes to an optional `metrics_hook(point, plugin_type, name, seconds)`, so the app
wires Prometheus without this module importing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from llamafleet_core.types import Action, Lookup, SlotRef
from llamafleet_router.scheduling.candidates import (
    Groups,
    candidates,
    restore_targets,
    slot_groups,
    with_spares,
)
from llamafleet_router.scheduling.config import PipelineConfig
from llamafleet_router.scheduling.decide import choose_action
from llamafleet_router.scheduling.framework import (
    ANY_SLOT,
    INDEX_AVAILABLE,
    LOOKUP,
    RESTORE_ENABLED,
    Branch,
    Candidate,
    CycleState,
    Decision,
    EndpointState,
    GatedScorer,
    MetricsHook,
    NoEndpointError,
    PluginHandle,
    PodScorer,
    PrefixIndexLike,
    SchedRequest,
    ScoredCandidate,
    Scorer,
    SlotLeasesLike,
    SlotNominator,
)
from llamafleet_router.scheduling.lookup_view import pod_best_slots
from llamafleet_router.scheduling.plugins.scorers.session_affinity import SessionAffinityScorer
from llamafleet_router.scheduling.registry import Registry, build_plugins, register_builtin_plugins
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.scheduling.weighing import weigh_candidates

log = logging.getLogger(__name__)

_MOVES = 2  # lease attempts when moving a restore to an older slot (another replica may hold them)


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
    ) -> None:
        self.config = config
        # What the action choice weighs per pod: learned from the answers the app feeds it (hooks.py).
        self.speeds = speeds if speeds is not None else (
            SpeedBook(config.decision) if config.decision.learn_speeds else None)
        self._leases = leases
        self._holder_prefix = holder_prefix
        self._metrics = metrics_hook
        plugins = build_plugins(config, registry or register_builtin_plugins(), PluginHandle(index=index))
        self.producers, self.filters, self.scorers = plugins.producers, plugins.filters, plugins.scorers
        self._hooks, self._produces = plugins.hooks, plugins.produces
        self.picker = plugins.picker
        self._affinity = {s.name for s, _ in self.scorers if isinstance(s, SessionAffinityScorer)}
        self._nominators = [s for s, _ in self.scorers if isinstance(s, SlotNominator)]
        # How to ask each scorer, decided once (isinstance on a Protocol is slow).
        self._plan: list[tuple[Scorer, float, PodScorer | None, GatedScorer | None]] = [
            (s, w, s if isinstance(s, PodScorer) else None, s if isinstance(s, GatedScorer) else None)
            for s, w in self.scorers
        ]

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
        lookup = state.read(LOOKUP, _EMPTY)
        named = slot_groups(lookup, (ref for n in self._nominators for ref in n.nominate(req, state)))
        idle = candidates(survivors, named, idle_only=True)
        decision = None
        if idle:
            ranked = self.rank(req, state, idle, [s for s in survivors if s.idle_slots])
            decision = await self._lease_best(req, state, ranked, named)
        if decision is None:
            decision = self._queued(req, state, survivors, named)
        self.on_decision(req, decision)
        return decision

    def rank(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate],
        endpoints: Sequence[EndpointState] | None = None,
    ) -> list[ScoredCandidate]:
        """Weighted scores of `candidates` (slots of `endpoints`, derived when not given), ranked best
        first by the picker.

        Pod-level scorers are asked once per pod, gated scorers that do not apply are skipped, and a
        slot-level answer that is 0 everywhere is not looked up per candidate: with 1,000 index entries
        the per-candidate dict lookups were most of the decision's cost."""
        clock = time.perf_counter
        if endpoints is None:
            endpoints = list({id(c.state): c.state for c in candidates}.values())
        zero: dict[str, float] = {}
        pod_level: list[tuple[str, float, Mapping[str, float]]] = []
        slot_level: list[tuple[str, float, dict[SlotRef, float]]] = []
        for scorer, weight, by_pod, gate in self._plan:
            started = clock()
            if gate is not None and not gate.applies(req, state):
                zero[scorer.name] = 0.0
            elif by_pod is not None:
                pod_level.append((scorer.name, weight, by_pod.score_pods(req, state, endpoints)))
            else:
                scores = scorer.score(req, state, candidates)
                if any(scores.values()):
                    slot_level.append((scorer.name, weight, scores))
                else:
                    zero[scorer.name] = 0.0
            self._report("scorer", scorer.type_name, scorer.name, started)
        scored = weigh_candidates(candidates, pod_level, slot_level, zero)
        started = clock()
        ranked = self.picker.pick(req, state, scored)
        self._report("picker", self.picker.type_name, self.picker.name, started)
        return ranked

    async def _lease_best(
        self, req: SchedRequest, state: CycleState, ranked: Sequence[ScoredCandidate], named: Groups
    ) -> Decision | None:
        holder = f"{self._holder_prefix}:{req.request_id}"
        attempts = self.config.leases.max_attempts
        for sc in ranked:
            # A candidate whose lease is taken stands for its group's other idle slots, which score
            # the same: try those next, as scoring every slot would have (see candidates.py).
            for c in with_spares(sc.candidate, named):
                if attempts <= 0:
                    return None
                attempts -= 1
                pick = sc if c is sc.candidate else ScoredCandidate(c, sc.total, sc.scores)
                if self._leases is None:
                    return await self._place(req, state, pick, self._decide(req, state, pick, None))
                started = time.perf_counter()
                try:
                    ok = await self._leases.acquire(c.key, holder, self.config.leases.ttl_s)
                except Exception as exc:  # lease store down: serve unleased rather than fail
                    log.warning("slot lease store unavailable (%s); proceeding without a lease", exc)
                    return self._decide(req, state, pick, None)
                finally:
                    self._report("lease", "slot-leases", "acquire", started)
                if ok:
                    return await self._place(req, state, pick, self._decide(req, state, pick, holder))
        return None

    async def _place(
        self, req: SchedRequest, state: CycleState, pick: ScoredCandidate, decision: Decision
    ) -> Decision:
        """A restore goes into the pod's idle slot used longest ago rather than the picked one, whose
        content it would replace (`candidates.restore_targets` says why); the lease moves with it."""
        if decision.action is not Action.RESTORE or decision.snapshot is None:
            return decision
        s, holder = pick.candidate.state, decision.lease_holder
        lookup = state.read(LOOKUP, _EMPTY)
        for slot in restore_targets(s, decision.slot, lookup, decision.snapshot.n_blocks)[:_MOVES]:
            if self._leases is not None and holder is not None:
                try:
                    ttl = self.config.leases.ttl_s
                    if not await self._leases.acquire(SlotRef(s.uid, slot), holder, ttl):
                        continue  # another replica's: try the next
                except Exception:
                    return decision
                await self.release(decision)
            moved = ScoredCandidate(Candidate(s, slot), pick.total, pick.scores)
            return self._decide(req, state, moved, holder)
        return decision

    def _decide(
        self, req: SchedRequest, state: CycleState, sc: ScoredCandidate, holder: str | None
    ) -> Decision:
        c = sc.candidate
        affinity = self._is_session_slot(sc)
        # Absent means "no index in this profile", as for the degraded-hash scorer.
        if not state.read(INDEX_AVAILABLE, True):
            # Nothing is known about slot contents: forward pinned and let llama-server reuse what it has.
            branch = Branch.SESSION_AFFINITY if affinity else Branch.DEGRADED_HASH
            return Decision(c.endpoint, c.slot, Action.DIRECT, None, 0, branch, holder)
        costs = self.config.decision if self.speeds is None else self.speeds.costs(c.endpoint.pod.uid)
        choice = choose_action(req.prompt, c.endpoint, c.slot, state.read(LOOKUP, Lookup()), costs,
                               others=c.state.in_flight)
        branch = Branch.SESSION_AFFINITY if choice.branch == Branch.COLD and affinity else choice.branch
        return Decision(c.endpoint, c.slot, choice.action, choice.snapshot, choice.predicted_blocks, branch,
                        holder, wanted=choice.wanted)

    def _queued(
        self, req: SchedRequest, state: CycleState, survivors: Sequence[EndpointState], named: Groups
    ) -> Decision:
        every = candidates(survivors, named, idle_only=False)
        ranked = self.rank(req, state, every, [s for s in survivors if s.endpoint.n_slots > 0])
        if not ranked:  # only endpoints reporting zero slots: let the server sort it out
            return Decision(survivors[0].endpoint, ANY_SLOT, Action.DIRECT, None, 0, Branch.QUEUED)
        top = ranked[0]
        endpoint = top.candidate.endpoint
        best = pod_best_slots(state.read(LOOKUP, Lookup()), endpoint.pod.uid, endpoint.n_slots)
        if best is not None:
            slots, blocks = best
            # Slots that hold the prefix alike (a SharedPrefix is in every slot): join the shortest of
            # their queues. Pinned to the lowest id, every queued request waited behind all the others
            # there while the pod's other slots freed and went to newcomers: 2 slots and 4 clients
            # made 3 answers' wait on slot 0, past a client's 30 s on a loaded machine.
            waiting = top.candidate.state.slot_requests
            slot = min(slots, key=lambda s: (waiting.get(s, 0), s))
            held = min(blocks, len(req.prompt.blocks))
            return Decision(endpoint, slot, Action.DIRECT, None, held, Branch.QUEUED)
        slot = top.candidate.slot if self._is_session_slot(top) else ANY_SLOT
        return Decision(endpoint, slot, Action.DIRECT, None, 0, Branch.QUEUED)

    def _is_session_slot(self, sc: ScoredCandidate) -> bool:
        return any(sc.scores.get(name, 0.0) >= 1.0 for name in self._affinity)

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
        if decision.lease_holder is None or self._leases is None:
            return
        try:
            await self._leases.release(decision.slot_ref, decision.lease_holder)
        except Exception as exc:
            log.warning("could not release lease on %s (%s); its TTL will", decision.slot_ref.key(), exc)

    def _report(self, point: str, plugin_type: str, name: str, started: float) -> None:
        """Per-plugin latency: one perf_counter pair per plugin, and nothing more without a hook."""
        if self._metrics is None:
            return
        try:
            self._metrics(point, plugin_type, name, time.perf_counter() - started)
        except Exception:
            log.exception("metrics hook failed")


_EMPTY = Lookup()

"""What the gateway does with the leased slot before it forwards a request: `SnapshotFlow.prepare`.

1. RESTORE decided (decide.py): pull the snapshot from its pod if needed, restore it into the slot. On
   any failure the decision becomes COMPUTE (branch `restore_failed`) and the request goes on.
2. First sight: when the request's session prefix is long enough, is strictly shorter than the prompt,
   the slot does not already hold it and no snapshot in the fleet holds it exactly, then
   - if another request of this replica is already building it: wait for that snapshot and restore it
     (branch `first_sight_wait`), unless that build is detached (below): then it restored the same
     stage and goes on at once. The wait lasts as long as the build is expected to (`wait_limit`: its
     pod's learned prefill rate, twice, plus a margin; within `first_sight_wait_min_s` and
     `first_sight_wait_s`, from the build's start); when it passes while the build still runs on the
     waiter's own pod, the waiter waits on up to the ceiling: never a second prefill of the head
     beside the first (moving such a waiter to another pod waits for the request director, issue 24);
   - a head with at least as many tokens as the pod's slot context (`/props` n_ctx) is never built:
     the request goes on as decided (llama-server answers 400), branch `head_exceeds_context`, one
     warning per head, `llamafleet_router_head_too_long_total`;
   - else build it (staged prefill and saves, `first_sight.StagedPrefill`) in the leased slot, on top
     of what step 1 restored (a next-day session resumes from the stage before the date line), and
     forward with the slot holding it (branch `first_sight`). When step 1 restored a stage snapshot
     and only a short tail is new (a later day: the date line), the build runs instead in another
     idle slot the gateway lends (`borrow`), from the same stage, and the request is forwarded at once
     (branch `restore_first_sight_detached`, `detached.DetachedBuilds`); without an idle slot it is
     built in place.
     Divergence points (divergence.py): a snapshot also at the last safe cut before where this head
     parts from its family's recorded heads or a slot's run, and at the family's learned points.
`prepare` never raises (except cancellation): the index is a hint and the request must be served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.types import UNKEYED, Action, Endpoint, SnapshotRef, TextHasher
from llamafleet_router.background import TaskSet
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.scheduling.decide import ActionCosts
from llamafleet_router.scheduling.framework import ANY_SLOT, Branch, Decision, SchedRequest
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.cuts import held_stage
from llamafleet_router.snapshots.detached import DETACH_MAX_TAIL_CHARS, BorrowSlot, DetachedBuilds
from llamafleet_router.snapshots.families import HeadFamilies
from llamafleet_router.snapshots.first_sight import (
    FlightKey,
    Flights,
    HeadTooLong,
    Prompt,
    StagedPrefill,
    StageFlights,
    StageKeys,
)
from llamafleet_router.snapshots.peers import peer_agents
from llamafleet_router.snapshots.prime import PrimedSlots, Primer
from llamafleet_router.snapshots.restore import Restored, RestoreExecutor, RestoreFailure
from llamafleet_router.snapshots.resync import Resync
from llamafleet_router.snapshots.ship import Shipper

log = logging.getLogger(__name__)

_KNOWN_TTL_S = 10.0  # how long "the fleet has a snapshot of this prefix" is trusted without a lookup
_KNOWN_MAX = 4096
_TOO_LONG_MAX = 4096  # heads remembered as too long for their pods (each warned about once)
# How long a waiter waits for another request's build (`SnapshotFlow.wait_limit`): the build's
# expected time, times this, plus this margin (a pod busy with other slots' batches prefills slower
# than it learned; tokenize and saves add a little), within the config's floor and ceiling.
WAIT_FACTOR = 2.0
WAIT_MARGIN_S = 5.0
# The prefill rate assumed for a pod with no learned full-batch rate, for waits only. Deliberately a
# slow CPU figure (README: a slot's own prefill ran at 200-400 tokens/s on the CPU test pods with the
# other slots holding 24K each; a whole 32K prefill took 40 s, ~800/s): guessing too slow only makes a
# waiter wait longer for a build that, when it ends early, wakes it at once; guessing too fast (the
# cost model's 2,000/s) made waiters give up on a real model's 16K-token head and compute it again.
UNKNOWN_POD_PREFILL_TOKENS_PER_S = 200.0


@dataclass(frozen=True, slots=True)
class _Build:
    """An in-place build in flight: where it runs, since when, and how long it is expected to take."""

    pod_uid: str
    started: float  # time.monotonic()
    expected_s: float


class SnapshotFlow:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, config: SnapshotConfig,
        metrics: SnapshotMetrics, tasks: TaskSet, speeds: SpeedBook | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._index = index
        self._speeds = speeds
        self._builds: dict[FlightKey, _Build] = {}  # builds in flight (their pod, start, expected time)
        self.restorer = RestoreExecutor(http=http, index=index, token=config.agent_token, metrics=metrics,
                                        tasks=tasks, speeds=speeds)
        self.staged = StagedPrefill(http=http, index=index, config=config, metrics=metrics)
        self.shipper = Shipper(restorer=self.restorer, metrics=metrics, tasks=tasks)
        self.resync = Resync(http=http, index=index, config=config, metrics=metrics)
        self.flights = Flights()
        self.stage_flights = StageFlights(self.flights, config)
        self.families = HeadFamilies(index=index, tasks=tasks, config=config)
        self._known: dict[FlightKey, float] = {}
        self._too_long: dict[FlightKey, int] = {}  # head -> its tokens, for heads found too long
        self.primer = Primer(http=http, index=index, restorer=self.restorer, metrics=metrics, tasks=tasks,
                             slots=PrimedSlots(), api_key=config.pod_api_key)
        # Set by the gateway: lends an idle slot (leased, counted in flight) to a background build.
        self.borrow: BorrowSlot | None = None
        self._detached = DetachedBuilds(
            config=config, metrics=metrics, tasks=tasks, restorer=self.restorer, staged=self.staged,
            stage_flights=self.stage_flights, remember=self._remember, finish=self._finish, index=index)

    async def prepare(self, req: SchedRequest, decision: Decision, pods: Sequence[PodStatus]) -> Decision:
        try:
            return await self._prepare(req, decision, pods)
        except Exception:
            log.exception("snapshot preparation failed; forwarding as decided")
            return decision

    async def _prepare(self, req: SchedRequest, decision: Decision, pods: Sequence[PodStatus]) -> Decision:
        target = decision.endpoint
        if decision.slot == ANY_SLOT:
            return decision
        primed = self.primer.slots.take(decision.slot_ref)  # the request changes what the slot holds
        if decision.branch is Branch.QUEUED or target.agent_url is None:
            return decision
        agents = peer_agents(pods, target, self.config.tokens)  # same namespace only (peers.py)
        if decision.wanted is not None and self.config.ship:
            self.shipper.ship(req.model, decision.wanted, req.prompt.blocks[: decision.wanted.n_blocks],
                              target, agents)
        restored: Restored | None = None
        failed: SnapshotRef | None = None
        context = slot_context(pods, target)
        if decision.action is Action.RESTORE and decision.snapshot is not None and (
                0 < context <= decision.snapshot.n_tokens):
            # Built on a pod with larger slots: this pod's server would refuse it (and the index would
            # then drop a snapshot good elsewhere), and the prompt, which extends it, too: nothing to do.
            return replace(self._too_long_branch(req.model, decision), action=Action.COMPUTE,
                           snapshot=None, predicted_blocks=0)
        if decision.action is Action.RESTORE and decision.snapshot is not None:
            snap = decision.snapshot
            reused = await self.primer.reuse(req.model, req.prompt.blocks, target.url, decision.slot_ref,
                                             snap, primed)
            outcome: Restored | RestoreFailure
            if reused is not None:  # loaded ahead of demand (prime.py) and untouched since
                outcome, decision = reused, replace(decision, snapshot=reused.snapshot, branch=Branch.PRIMED)
            else:
                outcome = await self.restorer.restore(req.model, req.prompt.blocks, target, decision.slot,
                                                      snap, agents)
            if isinstance(outcome, Restored):
                restored = outcome
            else:
                failed = snap
                decision = replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0,
                                   branch=Branch.RESTORE_FAILED)
        prompt = _prompt(req)
        if prompt is None or not self._worth_first_sight(prompt, decision, restored):
            return decision
        key = prompt.flight_key(prompt.session_chars)  # per tenant group: never another group's build
        session_hash = key[2]
        if self._exceeds(key, context):  # tokenized once already: not again for every request
            return self._too_long_branch(req.model, decision)
        if restored is not None and (restored.snapshot.text_hash, restored.snapshot.n_chars) == (
            session_hash, prompt.session_chars
        ):
            return decision
        if failed is None and self._is_known(key):
            return decision
        try:
            lookup = await self._index.lookup(prompt.model, prompt.blocks)
        except Exception as exc:  # no index: no first sight (nothing could find the snapshot anyway)
            log.info("index lookup for first sight failed", extra={"error": str(exc)})
            return decision
        exact = [s for s in lookup.snapshots
                 if s.text_hash == session_hash and s.n_chars == prompt.session_chars]
        if exact and (failed is None or any(s != failed for s in exact)):
            self._remember(key)
            return decision
        if self.flights.running(key) is None:
            # Nobody builds this session prefix, but another request may be building one that shares a
            # stage with it (another workspace's prefix, started a moment earlier): wait for that stage
            # and build only the rest, instead of computing the shared part a second time.
            staged = await self._restore_stage_in_flight(req, prompt, decision, restored, agents)
            if staged is not None:
                decision, restored = staged
        leader, flight = self.flights.join(key)
        if not leader and self._detached.running(key):
            return decision  # it restored the same stage: waiting for the build would only delay it
        if not leader:
            waited = await self._wait(req, decision, flight, agents, prompt, key)
            if waited is decision and self._exceeds(key, context):  # the leader found it too long
                return self._too_long_branch(req.model, decision)
            return waited
        self.metrics.first_sight.labels("leader").inc()
        started = time.perf_counter()
        # Where and for how long its waiters wait (`_wait`); known from here on, before any await
        # (ended by `_finish`, a detached build's too).
        from_chars = restored.snapshot.n_chars if restored is not None else 0
        self._builds[key] = _Build(target.uid, time.monotonic(),
                                   self.expected_build_s(prompt.session_chars - from_chars, target.uid))
        known = frozenset((s.text_hash, s.n_chars) for s in lookup.snapshots if s != failed)
        base = restored.snapshot if restored is not None else held_stage(
            prompt.text, prompt.session_chars, (decision.predicted_blocks + 1) * self.config.block_chars,
            [x for x in lookup.snapshots if x != failed], window=DETACH_MAX_TAIL_CHARS, hasher=prompt.hasher)
        tail = prompt.session_chars - base.n_chars if base is not None else 0
        learn = self.families.cuts_for(prompt, lookup, restored.snapshot if restored else None)
        if base is not None and self.borrow is not None and 0 < tail <= DETACH_MAX_TAIL_CHARS:
            # The slot resumes from a stage (restored, or held since a previous day) and only a short
            # tail is new: build the head in another slot from the stage's snapshot and forward now.
            # Claimed before any await (the family's read, the borrow's schedule and leases): a session
            # joining the flight meanwhile goes on as decided rather than waiting.
            self._detached.claim(key)
            borrowed = None
            try:
                extra = await learn
                borrowed = await self.borrow(req)
            finally:
                if borrowed is None:
                    self._detached.unclaim(key)
            if borrowed is not None:
                self.primer.slots.take(borrowed[0].slot_ref)  # the build overwrites what it was primed with
                self._detached.start(req, prompt, key, base, borrowed, agents, extra, known)
                detached = Branch.RESTORE_FIRST_SIGHT_DETACHED if restored else Branch.FIRST_SIGHT_DETACHED
                return replace(decision, branch=detached)
        else:
            extra = await learn
        stages = self.stage_flights.open(prompt, restored.snapshot.n_chars if restored else 0)
        build = asyncio.ensure_future(self.staged.build(
            prompt, target, decision.slot, start_tokens=restored.n_tokens if restored else 0,
            extra_cuts=extra, known=known, on_saved=self.stage_flights.saved(stages), slot_context=context,
        ))
        # The build goes on if this request is cancelled (client gone): waiters still get the snapshot.
        # (remembered there, before the flight ends: its waiters read it when they wake)
        build.add_done_callback(lambda t: self._finish(key, stages, self._built(key, req.model, t)))
        try:
            ref = await asyncio.shield(build)
        except HeadTooLong:
            return self._too_long_branch(req.model, decision)
        self.metrics.first_sight_seconds.observe(time.perf_counter() - started)
        if ref is None:
            return decision
        self._remember(key)
        if self.borrow is not None:  # up to `prime_slots` (0: none)
            self.primer.start(req, ref, pods, agents, self.borrow, self.config.prime_slots,
                              after=self._detached.answered(req.request_id))
        session_blocks = prompt.session_chars // self.config.block_chars
        if restored is not None:  # built on top of a restored stage snapshot: say which one
            return replace(decision, action=Action.RESTORE, snapshot=restored.snapshot,
                           predicted_blocks=session_blocks, branch=Branch.RESTORE_FIRST_SIGHT)
        return replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=session_blocks,
                       branch=Branch.FIRST_SIGHT)

    def _finish(self, key: FlightKey, stages: StageKeys, ref: SnapshotRef | None) -> None:
        self._builds.pop(key, None)
        self.stage_flights.finish(stages)
        self.flights.finish(key, ref)

    async def _restore_stage_in_flight(
        self, req: SchedRequest, prompt: Prompt, decision: Decision, restored: Restored | None,
        agents: dict[str, str],
    ) -> tuple[Decision, Restored] | None:
        """Wait for the latest of this prompt's stages that another request is building, and restore it
        into the slot; None when no such build runs or it did not save the stage."""
        after = restored.snapshot.n_chars if restored is not None else 0
        for stage_chars, stage_key in sorted(self.stage_flights.keys(prompt, after).items(), reverse=True):
            flight = self.flights.running(stage_key)
            if flight is None:
                continue
            self.metrics.first_sight.labels("stage_waiter").inc()
            limit = self.wait_limit(self.expected_build_s(stage_chars, decision.endpoint.uid))
            built = await self._restore_when_built(req, decision, flight, agents, limit)
            if built is None:
                return None
            ref, outcome = built
            if outcome is None:
                return None
            return replace(decision, action=Action.RESTORE, snapshot=outcome.snapshot,
                           predicted_blocks=ref.n_blocks, branch=Branch.RESTORE_STAGE_WAIT), outcome
        return None

    async def _restore_when_built(
        self, req: SchedRequest, decision: Decision, flight: asyncio.Future[SnapshotRef | None],
        agents: dict[str, str], limit: float,
    ) -> tuple[SnapshotRef, Restored | None] | None:
        """Wait (at most `limit` seconds) for the snapshot another request is building and restore it
        into the decision's slot: None when nothing was built in time, (ref, None) when the restore
        failed."""
        try:
            ref = await asyncio.wait_for(asyncio.shield(flight), max(limit, 0.0))
        except TimeoutError:
            return None
        if ref is None:
            return None
        outcome = await self.restorer.restore(req.model, req.prompt.blocks, decision.endpoint, decision.slot,
                                              ref, agents)
        return ref, outcome if isinstance(outcome, Restored) else None

    def request_answering(self, request_id: str) -> None:
        """The gateway's signal that a request answers (its first byte) or ended: a build detached from
        it may start now."""
        self._detached.request_answering(request_id)

    def _worth_first_sight(self, prompt: Prompt, decision: Decision, restored: Restored | None) -> bool:
        if prompt.session_chars < self.config.first_sight_min_chars:
            return False
        # An exact resend of a snapshot gains nothing on a hybrid model (the last token is always
        # evaluated again, and recurrent state cannot step back): the prompt must extend the prefix.
        if prompt.session_chars >= len(prompt.text):
            return False
        session_blocks = prompt.session_chars // self.config.block_chars
        # The slot already holds the session prefix (a later turn): nothing to build.
        return restored is not None or decision.predicted_blocks < session_blocks

    def expected_build_s(self, chars: int, pod_uid: str) -> float:
        """Seconds a build of `chars` characters of a head is expected to take on `pod_uid`: its tokens
        (the cost model's `chars_per_token`) over the pod's learned full-batch prefill rate, or
        `UNKNOWN_POD_PREFILL_TOKENS_PER_S` while it has none."""
        costs = self._speeds.costs(pod_uid) if self._speeds is not None else ActionCosts()
        learned = self._speeds is not None and "prefill_tokens_per_s" in self._speeds.learned(pod_uid)
        rate = costs.prefill_tokens_per_s if learned else UNKNOWN_POD_PREFILL_TOKENS_PER_S
        return max(chars, 0) / costs.chars_per_token / rate

    def wait_limit(self, expected_s: float) -> float:
        """How long a waiter waits for a build expected to take `expected_s`: `WAIT_FACTOR` times it
        plus `WAIT_MARGIN_S`, at least `first_sight_wait_min_s`, at most `first_sight_wait_s`."""
        config = self.config
        floor = min(config.first_sight_wait_min_s, config.first_sight_wait_s)
        return min(config.first_sight_wait_s, max(floor, expected_s * WAIT_FACTOR + WAIT_MARGIN_S))

    async def _wait(
        self, req: SchedRequest, decision: Decision, flight: asyncio.Future[SnapshotRef | None],
        agents: dict[str, str], prompt: Prompt, key: FlightKey,
    ) -> Decision:
        self.metrics.first_sight.labels("waiter").inc()
        build = self._builds.get(key)
        if build is None:  # (not expected: the leader records it as it joins; its own pod then)
            limit = self.wait_limit(self.expected_build_s(prompt.session_chars, decision.endpoint.uid))
        else:  # counted from the build's start: a waiter that joins late does not wait longer
            limit = build.started + self.wait_limit(build.expected_s) - time.monotonic()
        built = await self._restore_when_built(req, decision, flight, agents, limit)
        if built is None and build is not None and build.pod_uid == decision.endpoint.uid and (
                not flight.done()):
            # The leader still builds the head on this very pod: a second prefill beside it would slow
            # both, and the leader, however late, finishes first. Wait on, up to the ceiling (from the
            # build's start).
            rest = build.started + self.config.first_sight_wait_s - time.monotonic()
            built = await self._restore_when_built(req, decision, flight, agents, rest)
        if built is None:
            return decision
        ref, outcome = built
        if outcome is None:
            return replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0,
                           branch=Branch.RESTORE_FAILED)
        return replace(decision, action=Action.RESTORE, snapshot=outcome.snapshot,
                       predicted_blocks=ref.n_blocks, branch=Branch.FIRST_SIGHT_WAIT)

    def _exceeds(self, key: FlightKey, context: int) -> bool:
        n_tokens = self._too_long.get(key)
        return n_tokens is not None and 0 < context <= n_tokens

    def _too_long_branch(self, model: str, decision: Decision) -> Decision:
        self.metrics.head_too_long.labels(model).inc()
        return replace(decision, branch=Branch.HEAD_EXCEEDS_CONTEXT)

    def _built(self, key: FlightKey, model: str, task: asyncio.Future[SnapshotRef | None],
               ) -> SnapshotRef | None:
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, HeadTooLong):
            self._remember_too_long(key, model, exc)
        return _result(task)

    def _remember_too_long(self, key: FlightKey, model: str, exc: HeadTooLong) -> None:
        if key in self._too_long:
            return
        if len(self._too_long) >= _TOO_LONG_MAX:  # forget the oldest: it is warned about again
            del self._too_long[next(iter(self._too_long))]
        self._too_long[key] = exc.n_tokens
        log.warning("a head exceeds the slot context: not built, the request goes on as decided",
                    extra={"model": model, "head_tokens": exc.n_tokens, "slot_context": exc.slot_context})

    def _is_known(self, key: FlightKey) -> bool:
        deadline = self._known.get(key)
        return deadline is not None and deadline > time.monotonic()

    def _remember(self, key: FlightKey) -> None:
        if len(self._known) >= _KNOWN_MAX:
            now = time.monotonic()
            self._known = {k: d for k, d in self._known.items() if d > now}
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
        self._known[key] = time.monotonic() + _KNOWN_TTL_S


def slot_context(pods: Sequence[PodStatus], target: Endpoint) -> int:
    """The per-slot context the target pod reported (`/props` n_ctx); 0 when unknown."""
    pod = next((p for p in pods if p.endpoint.uid == target.uid), None)
    return pod.props.n_ctx if pod is not None and pod.props is not None else 0


def _prompt(req: SchedRequest) -> Prompt | None:
    """The exact text and the cut first sight builds, when the identity has them (PromptIdentity does).

    The cut is the SHARED prefix (before the first user message), not the session prefix: once a
    conversation has history, its own prefix is sent by no other session, and snapshotting it cost a
    staged prefill per turn (a 50-session mixed workload computed 2.7x the tokens it needed)."""
    text = getattr(req.prompt, "text", None)
    session = getattr(req.prompt, "shared_chars", getattr(req.prompt, "session_prefix_chars", None))
    if not isinstance(text, str) or not isinstance(session, int):
        return None
    hasher = getattr(req.prompt, "hasher", None)
    return Prompt(req.model, text, tuple(req.prompt.blocks), session,
                  hasher if isinstance(hasher, TextHasher) else UNKEYED)


def _result(task: asyncio.Future[SnapshotRef | None]) -> SnapshotRef | None:
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()

"""Waiting for another request's first-sight build, and restoring what it saved.

A request whose head another request of this replica is building waits for that build's snapshot and
restores it (`first_sight_wait`) rather than prefilling the head a second time beside it. A request
whose head shares a stage with a build in flight (another workspace's head, started a moment earlier)
waits for that stage and builds only the rest (`restore_stage_wait`).

How long: as long as the build is expected to take (`wait_limit`: its pod's learned prefill rate,
`WAIT_FACTOR` times, plus `WAIT_MARGIN_S`; within `first_sight_wait_min_s` and `first_sight_wait_s`,
counted from the build's start). When that passes while the build still runs on the waiter's own pod,
a second prefill beside the first would slow both; so the waiter moves to another pod when one has an
idle slot and is expected to compute the head before the build ends (`Branch.FIRST_SIGHT_MOVED`: the
director schedules it again without the build's pod), and otherwise waits on, up to the ceiling. How
long the build still needs is read from its progress (`HeadBuilds.remaining_s`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llamafleet_core.types import Action, Endpoint, SnapshotRef
from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.scheduling.framework import Branch, SchedRequest
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.flights import FlightKey, Flights, Prompt, StageFlights, StageKeys
from llamafleet_router.snapshots.preparation import Preparation
from llamafleet_router.snapshots.restore import Restored, RestoreExecutor

# A waiter waits for a build's expected time times this, plus this margin: a pod busy with other slots'
# batches prefills slower than it learned, and tokenize and saves add a little.
WAIT_FACTOR = 2.0
WAIT_MARGIN_S = 5.0
# The prefill rate assumed for a pod with no learned full-batch rate, for waits only: deliberately a
# slow CPU figure. Too slow only makes a waiter wait longer for a build that wakes it when it ends;
# too fast made waiters give up on a real model's long head and compute it again (docs/design.md,
# "Measurements behind the rules").
UNKNOWN_POD_PREFILL_TOKENS_PER_S = 200.0

Flight = asyncio.Future[SnapshotRef | None]

# The model's ready pods with an idle slot now, but the one named (`SlotLender.idle_pods`).
IdlePods = Callable[[SchedRequest, str], Awaitable[Sequence[Endpoint]]]


@dataclass(frozen=True, slots=True)
class Build:
    """A build in flight: where it runs, since when, what it computes (the head's characters from
    `from_chars`, what the slot held, to `to_chars`) and how long that is expected to take. `computing`
    is set once its prefill is under way (its stage flights open, or its detached build started)."""

    pod_uid: str
    started: float  # time.monotonic()
    expected_s: float
    from_chars: int = 0
    to_chars: int = 0
    computing: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


def remaining_s(build: Build, saved: tuple[int, float] | None, next_stage: int | None, now: float,
                ) -> float | None:
    """Seconds `build` still needs, from its progress (pure): `saved` is its latest saved stage (chars,
    when), `next_stage` the first stage it has not saved. After a save, the rest at the rate it ran
    so far; before any, at least what is left past `next_stage` at a rate below the one that would
    have saved it by `now`. None: nothing to tell (no stage to go by)."""
    if saved is not None:
        chars, at = saved
        if chars > build.from_chars and at > build.started:
            rate = (chars - build.from_chars) / (at - build.started)
            return max(0.0, (build.to_chars - chars) / rate - (now - at))
    if next_stage is None or not build.from_chars < next_stage < build.to_chars or now <= build.started:
        return None
    fastest = (next_stage - build.from_chars) / (now - build.started)
    return (build.to_chars - next_stage) / fastest


class HeadBuilds:
    """The builds in flight, by head, and their single flights (a build's end ends its flights)."""

    def __init__(self, flights: Flights, stage_flights: StageFlights, config: SnapshotConfig,
                 speeds: SpeedBook | None) -> None:
        self.flights = flights
        self.stage_flights = stage_flights
        self._config = config
        self._speeds = speeds
        self._running: dict[FlightKey, Build] = {}
        self._saved: dict[FlightKey, tuple[int, float]] = {}  # each build's latest stage: (chars, when)

    def begin(self, key: FlightKey, pod_uid: str, from_chars: int, to_chars: int) -> None:
        """A build of the head `key`, from `from_chars` (what the slot holds) to `to_chars`, starts on
        `pod_uid` (before any await: its waiters read where and for how long to wait)."""
        expected = self.expected_s(to_chars - from_chars, pod_uid)
        self._running[key] = Build(pod_uid, time.monotonic(), expected, from_chars, to_chars)

    def get(self, key: FlightKey) -> Build | None:
        return self._running.get(key)

    def on_saved(self, key: FlightKey, stages: StageKeys) -> Callable[[int, SnapshotRef], None]:
        """The build's `on_saved`: ends the stage's flight and records how far the build got."""
        end_flight = self.stage_flights.saved(stages)

        def saved(chars: int, ref: SnapshotRef) -> None:
            self._saved[key] = (chars, time.monotonic())
            end_flight(chars, ref)
        return saved

    def remaining_s(self, key: FlightKey, prompt: Prompt) -> float | None:
        """Seconds the build of `key` still needs, from its progress (`remaining_s`); None: unknown."""
        build = self._running.get(key)
        if build is None:
            return None
        saved = self._saved.get(key)
        done = saved[0] if saved is not None else build.from_chars
        ahead = [c for c in self.stage_flights.keys(prompt, done) if c < build.to_chars]
        return remaining_s(build, saved, min(ahead, default=None), time.monotonic())

    def computing(self, key: FlightKey) -> None:
        """The build of `key` has started its prefill (`Build.computing`)."""
        build = self._running.get(key)
        if build is not None:
            build.computing.set()

    def finish(self, key: FlightKey, stages: StageKeys, ref: SnapshotRef | None) -> None:
        self._running.pop(key, None)
        self._saved.pop(key, None)
        self.stage_flights.finish(stages)
        self.flights.finish(key, ref)

    def expected_s(self, chars: int, pod_uid: str) -> float:
        """Seconds a build of `chars` characters is expected to take on `pod_uid`: its tokens (the cost
        model's `chars_per_token`) over the pod's learned full-batch prefill rate, or
        `UNKNOWN_POD_PREFILL_TOKENS_PER_S` while it has none."""
        costs = self._speeds.costs(pod_uid) if self._speeds is not None else ActionCosts()
        learned = self._speeds is not None and "prefill_tokens_per_s" in self._speeds.learned(pod_uid)
        rate = costs.prefill_tokens_per_s if learned else UNKNOWN_POD_PREFILL_TOKENS_PER_S
        return max(chars, 0) / costs.chars_per_token / rate

    def wait_limit(self, expected_s: float) -> float:
        """How long a waiter waits for a build expected to take `expected_s`."""
        config = self._config
        floor = min(config.first_sight_wait_min_s, config.first_sight_wait_s)
        return min(config.first_sight_wait_s, max(floor, expected_s * WAIT_FACTOR + WAIT_MARGIN_S))


class BuildWaits:
    def __init__(self, builds: HeadBuilds, restorer: RestoreExecutor, metrics: SnapshotMetrics,
                 config: SnapshotConfig, idle_pods: IdlePods | None = None) -> None:
        """`idle_pods`: the pods with an idle slot now, but one (the gateway's lender); without it no
        waiter moves."""
        self._builds = builds
        self._restorer = restorer
        self._metrics = metrics
        self._config = config
        self._idle_pods = idle_pods

    async def for_head(self, prep: Preparation, flight: Flight, prompt: Prompt, key: FlightKey) -> bool:
        """Wait for the build of the head `key` and restore it into the slot; False when nothing came
        in time (the decision is unchanged)."""
        self._metrics.first_sight.labels("waiter").inc()
        builds, target = self._builds, prep.target
        build = builds.get(key)
        if build is None:  # (not expected: the leader records it as it joins; its own pod then)
            limit = builds.wait_limit(builds.expected_s(prompt.head_chars, target.uid))
        else:  # counted from the build's start: a waiter that joins late does not wait longer
            limit = build.started + builds.wait_limit(build.expected_s) - time.monotonic()
        built = await self._restore_when_built(prep, flight, limit)
        if built is None and build is not None and build.pod_uid == target.uid and not flight.done():
            if await self._sooner_elsewhere(prep, prompt, key, build):
                prep.settle(replace(prep.decision, branch=Branch.FIRST_SIGHT_MOVED))
                self._metrics.first_sight.labels("moved").inc()
                return True
            # The leader still builds the head on this very pod and finishes before a second prefill
            # beside it would.
            rest = build.started + self._config.first_sight_wait_s - time.monotonic()
            built = await self._restore_when_built(prep, flight, rest)
        if built is None:
            return False
        ref, outcome = built
        if outcome is None:
            prep.decision = replace(prep.decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0,
                                    branch=Branch.RESTORE_FAILED)
        else:
            prep.restored = outcome
            prep.decision = replace(prep.decision, action=Action.RESTORE, snapshot=outcome.snapshot,
                                    predicted_blocks=ref.n_blocks, branch=Branch.FIRST_SIGHT_WAIT)
        return True

    async def _sooner_elsewhere(self, prep: Preparation, prompt: Prompt, key: FlightKey, build: Build,
                                ) -> bool:
        """Whether a pod with an idle slot, other than the build's, is expected to compute the whole
        head before the build ends (an unknown end: no)."""
        if self._idle_pods is None or not prep.may_move:
            return False
        remaining = self._builds.remaining_s(key, prompt)
        if remaining is None:
            return False
        idle = await self._idle_pods(prep.req, build.pod_uid)
        return any(self._builds.expected_s(prompt.head_chars, e.uid) < remaining for e in idle)

    async def for_stage(self, prep: Preparation, prompt: Prompt) -> None:
        """Wait for the latest of the head's stages that another request is building, and restore it
        into the slot (the decision is unchanged when no such build runs or it saved nothing)."""
        after = prep.restored.snapshot.n_chars if prep.restored is not None else 0
        builds = self._builds
        for stage_chars, stage_key in sorted(builds.stage_flights.keys(prompt, after).items(), reverse=True):
            flight = builds.flights.running(stage_key)
            if flight is None:
                continue
            self._metrics.first_sight.labels("stage_waiter").inc()
            limit = builds.wait_limit(builds.expected_s(stage_chars, prep.target.uid))
            built = await self._restore_when_built(prep, flight, limit)
            ref, outcome = built if built is not None else (None, None)
            if ref is not None and outcome is not None:
                prep.restored = outcome
                prep.decision = replace(prep.decision, action=Action.RESTORE, snapshot=outcome.snapshot,
                                        predicted_blocks=ref.n_blocks, branch=Branch.RESTORE_STAGE_WAIT)
            return

    async def until_computing(self, prep: Preparation, prompt: Prompt, build: Build, head: Flight) -> None:
        """Wait (within the build's own limit, and never past the head's flight `head`) until the build
        of this prompt's head has started and saved its first stage: its slot then computes the rest,
        and a --slot-attach server waits for that slot rather than computing the head beside it (a
        request that arrives before the build's own prefill does not know it is coming)."""
        builds = self._builds
        limit = build.started + builds.wait_limit(build.expected_s) - time.monotonic()
        deadline = time.monotonic() + max(limit, 0.0)
        started = asyncio.ensure_future(build.computing.wait())
        either: list[asyncio.Future[Any]] = [started, head]
        try:
            await asyncio.wait(either, timeout=max(limit, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        for _, stage_key in sorted(builds.stage_flights.keys(prompt, 0).items()):
            flight = builds.flights.running(stage_key)
            if flight is None or head.done():
                continue
            await asyncio.wait([flight, head], timeout=max(deadline - time.monotonic(), 0.0),
                               return_when=asyncio.FIRST_COMPLETED)
            return

    async def _restore_when_built(
        self, prep: Preparation, flight: Flight, limit: float,
    ) -> tuple[SnapshotRef, Restored | None] | None:
        """Wait (at most `limit` seconds) for the snapshot of `flight` and restore it into the slot: None
        when nothing was built in time, (ref, None) when the restore failed."""
        try:
            async with asyncio.timeout(max(limit, 0.0)):
                ref = await asyncio.shield(flight)  # the build goes on for others when this wait ends
        except TimeoutError:
            return None
        if ref is None:
            return None
        req = prep.req
        outcome = await self._restorer.restore(req.model, req.prompt.blocks, prep.target, prep.decision.slot,
                                               ref, prep.agents)
        return ref, outcome if isinstance(outcome, Restored) else None

"""Waiting for another request's first-sight build, and restoring what it saved.

A request whose head another request of this replica is building waits for that build's snapshot and
restores it (`first_sight_wait`) rather than prefilling the head a second time beside it. A request
whose head shares a stage with a build in flight (another workspace's head, started a moment earlier)
waits for that stage and builds only the rest (`restore_stage_wait`).

How long: as long as the build is expected to take (`wait_limit`: its pod's learned prefill rate,
`WAIT_FACTOR` times, plus `WAIT_MARGIN_S`; within `first_sight_wait_min_s` and `first_sight_wait_s`,
counted from the build's start). When that passes while the build still runs on the waiter's own pod,
the waiter waits on up to the ceiling: a second prefill beside the first would slow both.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from llamafleet_core.types import Action, SnapshotRef
from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.scheduling.framework import Branch
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


@dataclass(frozen=True, slots=True)
class Build:
    """A build in flight: where it runs, since when, and how long it is expected to take. `computing`
    is set once its prefill is under way (its stage flights open, or its detached build started)."""

    pod_uid: str
    started: float  # time.monotonic()
    expected_s: float
    computing: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


class HeadBuilds:
    """The builds in flight, by head, and their single flights (a build's end ends its flights)."""

    def __init__(self, flights: Flights, stage_flights: StageFlights, config: SnapshotConfig,
                 speeds: SpeedBook | None) -> None:
        self.flights = flights
        self.stage_flights = stage_flights
        self._config = config
        self._speeds = speeds
        self._running: dict[FlightKey, Build] = {}

    def begin(self, key: FlightKey, pod_uid: str, chars: int) -> None:
        """A build of `chars` characters of the head `key` starts on `pod_uid` (before any await: its
        waiters read where and for how long to wait)."""
        self._running[key] = Build(pod_uid, time.monotonic(), self.expected_s(chars, pod_uid))

    def get(self, key: FlightKey) -> Build | None:
        return self._running.get(key)

    def computing(self, key: FlightKey) -> None:
        """The build of `key` has started its prefill (`Build.computing`)."""
        build = self._running.get(key)
        if build is not None:
            build.computing.set()

    def finish(self, key: FlightKey, stages: StageKeys, ref: SnapshotRef | None) -> None:
        self._running.pop(key, None)
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
                 config: SnapshotConfig) -> None:
        self._builds = builds
        self._restorer = restorer
        self._metrics = metrics
        self._config = config

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
            # The leader still builds the head on this very pod and, however late, finishes first.
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

"""The detached first-sight build: a later day's session prefix built in a borrowed slot, off the request.

On a later day a session resumes from a stage snapshot (restored, or still held by the slot from a
previous day's session) and only a short tail is new: the date line. Building the session prefix in
the request's own slot would hold that request for a tokenize, a prefill and a save; instead
`SnapshotFlow` forwards the request at once and hands the build to `DetachedBuilds.start`, in another
idle slot the gateway lends (`SlotLender`: claimed like a request's slot, so no request is pinned to it
meanwhile).

Why it lives apart from the flow, and its rules:
- It starts only once the request it was detached from answers (its first byte, or its end:
  `request_answering`), or after `_DETACHED_START_S` at the latest: on a small pod the build's tokenize
  and prefill would otherwise compete with that request for the same cores.
- It restores the stage into the borrowed slot and builds the session prefix there with the same staged
  prefill and stage single flight as an in-place build.
- Concurrent sessions that restored the same stage do not wait for it (`running`): they already hold
  what the build starts from, and waiting would only delay them.
- The flight ends whatever happens, and the borrowed slot is given back (its claim's one release).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.types import Endpoint, SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.scheduling.framework import Decision, SchedRequest
from llamafleet_router.scheduling.lookup_view import snapshot_tags
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.first_sight import StagedPrefill
from llamafleet_router.snapshots.flights import FlightKey, Prompt, StageFlights, StageKeys
from llamafleet_router.snapshots.restore import Restored, RestoreExecutor

log = logging.getLogger(__name__)

_DETACHED_START_S = 5.0  # a detached build waits at most this long for its request's first byte
# A detached build computes the tail after the stage again, beside the request that computes it too:
# worth it for a date line (tens of tokens) and for a workspace's block (a real client's working folder
# sits ~1.3K characters before its head's end: built in place, the tokenize, the tail's prefill and its
# saves held that request longer than a plain server took; docs/design.md, "A later day's session
# prefix is built beside the request"); a longer tail is built once, in place.
DETACH_MAX_TAIL_CHARS = 4096

class LentSlot(Protocol):
    """A slot lent to a background build: the scheduling decision that holds it, and its one release
    (`request.claim.SlotClaim`)."""

    @property
    def decision(self) -> Decision: ...

    def release(self, first: Awaitable[None] | None = None) -> None: ...


class SlotLender(Protocol):
    """Lends an idle slot for `req`'s prompt (on pod `pod_uid` only, when given, only while that pod
    has at least `min_idle` idle slots, and none of the slots in `avoid`); None when there is none
    (`request.lender.SlotLender`)."""

    async def lend(
        self, req: SchedRequest, *, pod_uid: str | None = None, min_idle: int = 1,
        avoid: frozenset[int] = frozenset(),
    ) -> LentSlot | None: ...

    async def idle_pods(self, req: SchedRequest, pod_uid: str) -> Sequence[Endpoint]:
        """The ready pods of `req`'s model with an idle slot now, but `pod_uid` (nothing is claimed)."""
        ...


class DetachedBuilds:
    """The builds running in borrowed slots, and the requests whose answer they wait for.

    `remember` and `finish` are the flow's: a built snapshot is remembered as known to the fleet, and
    the session and stage flights end exactly as an in-place build ends them."""

    def __init__(
        self, *, config: SnapshotConfig, metrics: SnapshotMetrics, tasks: TaskSet, restorer: RestoreExecutor,
        staged: StagedPrefill, stage_flights: StageFlights, remember: Callable[[FlightKey], None],
        finish: Callable[[FlightKey, StageKeys, SnapshotRef | None], None], index: PrefixIndex,
    ) -> None:
        self.config = config
        self._index = index
        self.metrics = metrics
        self._tasks = tasks
        self._restorer = restorer
        self._staged = staged
        self._stage_flights = stage_flights
        self._remember = remember
        self._finish = finish
        self._detached: set[FlightKey] = set()  # flights building in a borrowed slot
        self._answering: dict[str, asyncio.Event] = {}  # request id -> set when it answers

    def running(self, key: FlightKey) -> bool:
        """Whether the flight `key` is being built detached (its waiters need not wait)."""
        return key in self._detached

    def claim(self, key: FlightKey) -> None:
        """The flight's leader is about to borrow a slot for it: count it as detached from now on."""
        self._detached.add(key)

    def unclaim(self, key: FlightKey) -> None:
        """No slot could be borrowed: the leader builds in place after all."""
        self._detached.discard(key)

    def start(
        self, req: SchedRequest, prompt: Prompt, key: FlightKey, stage: SnapshotRef, borrowed: LentSlot,
        agents: dict[str, str], extra: list[int], known: frozenset[tuple[str, int]],
    ) -> None:
        """Spawn the build of `key` from `stage` in the borrowed slot; it waits for `req` to answer."""
        self._detached.add(key)
        answering = self._answering[req.request_id] = asyncio.Event()
        self._tasks.spawn(self._build_detached(
            req, prompt, key, stage, borrowed, agents, extra, known, answering),
            name="first-sight-detached")

    def request_answering(self, request_id: str) -> None:
        """The gateway's signal that a request answers (its first byte) or ended: a build detached from
        it, or a priming after its build (`answered`), may start now."""
        event = self._answering.pop(request_id, None)
        if event is not None:
            event.set()

    def answered(self, request_id: str) -> asyncio.Event:
        """An event set when the request answers or ends (for background work that must not compete
        with it for the pod's cores)."""
        return self._answering.setdefault(request_id, asyncio.Event())

    async def _build_detached(
        self, req: SchedRequest, prompt: Prompt, key: FlightKey, stage: SnapshotRef,
        borrowed: LentSlot, agents: dict[str, str], extra: list[int], known: frozenset[tuple[str, int]],
        answering: asyncio.Event,
    ) -> None:
        """Restore `stage` into the borrowed slot, build the session prefix there, then give it back.

        It starts once the request it was detached from answers (`request_answering`), or after
        `_DETACHED_START_S` at the latest: on a small pod the build's tokenize and prefill would
        otherwise compete with that request for the same cores. The flight ends whatever happens."""
        slot = borrowed.decision
        ref: SnapshotRef | None = None
        stages: StageKeys = {}
        touched = False
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self.config.first_sight_wait_s, _DETACHED_START_S)):
                    await answering.wait()
            started = time.perf_counter()
            touched = True
            outcome = await self._restorer.restore(req.model, req.prompt.blocks, slot.endpoint, slot.slot,
                                                   stage, agents)
            if isinstance(outcome, Restored):
                stages = self._stage_flights.open(prompt, outcome.snapshot.n_chars)
                ref = await self._staged.build(
                    prompt, slot.endpoint, slot.slot, start_tokens=outcome.n_tokens, extra_cuts=extra,
                    known=known, on_saved=self._stage_flights.saved(stages))
            if ref is not None:
                self._remember(key)
                self.metrics.first_sight_seconds.observe(time.perf_counter() - started)
        except Exception:
            log.exception("detached first-sight build failed")
        finally:
            self._answering.pop(req.request_id, None)
            self._detached.discard(key)
            self._finish(key, stages, ref)
            if touched:  # before the slot is given back: the next request must see what it holds
                await self._record(req, slot, ref)
            borrowed.release()

    async def _record(self, req: SchedRequest, slot: Decision, built: SnapshotRef | None) -> None:
        """What the borrowed slot holds now: the built prefix, or nothing known (a failed build). Left
        as it was, the index would still name the slot's previous content, tags included, and a
        conversation's next turn would be sent to a slot that no longer holds it."""
        try:
            if built is None:
                await self._index.forget_slot(req.model, slot.slot_ref)
            else:
                await self._index.record_slot(req.model, slot.slot_ref, req.prompt.blocks[: built.n_blocks],
                                              built.n_tokens, snapshot_tags(req.prompt, built))
        except Exception as exc:  # the index is a hint; the server's cache_n corrects it later
            log.info("recording a borrowed slot failed", extra={"error": str(exc)})

"""The first-sight leader: the one request of this replica that builds a head nobody has a snapshot of.

It builds in its own slot (staged prefill and saves, `first_sight.StagedPrefill`), on top of what the
restore step put there, and is forwarded with the slot holding the head (`first_sight`, or
`restore_first_sight` on a restored stage). When the slot resumes from a stage snapshot and only a
short tail is new (a later day: the date line; a workspace's block), the head is built instead in
another idle slot the gateway lends, from the same stage, and the request is forwarded at once
(`first_sight_detached`, detached.py); without an idle slot it is built in place.

The in-place build goes on if the request is cancelled (client gone): its waiters still get the snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from llamafleet_core.types import Action, Lookup, SnapshotRef
from llamafleet_router.scheduling.framework import Branch
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.cuts import held_stage
from llamafleet_router.snapshots.detached import DETACH_MAX_TAIL_CHARS, DetachedBuilds, SlotLender
from llamafleet_router.snapshots.families import HeadFamilies
from llamafleet_router.snapshots.first_sight import HeadTooLong, StagedPrefill
from llamafleet_router.snapshots.flights import FlightKey, Prompt
from llamafleet_router.snapshots.heads import HeadMemory
from llamafleet_router.snapshots.preparation import Preparation
from llamafleet_router.snapshots.prime import PrimedSlots
from llamafleet_router.snapshots.waits import HeadBuilds


class Leader:
    def __init__(
        self, *, staged: StagedPrefill, builds: HeadBuilds, families: HeadFamilies, detached: DetachedBuilds,
        heads: HeadMemory, primed: PrimedSlots, lender: SlotLender | None, config: SnapshotConfig,
        metrics: SnapshotMetrics,
    ) -> None:
        self._staged = staged
        self._builds = builds
        self._families = families
        self._detached = detached
        self._heads = heads
        self._primed = primed
        self._lender = lender
        self._config = config
        self._metrics = metrics

    async def lead(self, prep: Preparation, prompt: Prompt, key: FlightKey, lookup: Lookup) -> None:
        """Build the head `key` (this request leads its flight) and say so in the decision."""
        self._metrics.first_sight.labels("leader").inc()
        started = time.perf_counter()
        restored, failed, target = prep.restored, prep.failed, prep.target
        from_chars = restored.snapshot.n_chars if restored is not None else 0
        self._builds.begin(key, target.uid, from_chars, prompt.head_chars)
        known = frozenset((s.text_hash, s.n_chars) for s in lookup.snapshots if s != failed)
        base = restored.snapshot if restored is not None else held_stage(
            prompt.text, prompt.head_chars, (prep.decision.predicted_blocks + 1) * self._config.block_chars,
            [x for x in lookup.snapshots if x != failed], window=DETACH_MAX_TAIL_CHARS, hasher=prompt.hasher)
        tail = prompt.head_chars - base.n_chars if base is not None else 0
        learn = self._families.cuts_for(prompt, lookup, restored.snapshot if restored else None)
        lender = self._lender
        if base is not None and lender is not None and 0 < tail <= DETACH_MAX_TAIL_CHARS:
            detached, extra = await self._detach(prep, prompt, key, base, learn, known, lender)
            if detached:
                return
        else:
            extra = await learn
        stages = self._builds.stage_flights.open(prompt, from_chars)
        build = asyncio.ensure_future(self._staged.build(
            prompt, target, prep.decision.slot, start_tokens=restored.n_tokens if restored else 0,
            extra_cuts=extra, known=known, on_saved=self._builds.on_saved(key, stages),
            slot_context=prep.slot_context,
        ))
        self._builds.computing(key)  # its stage flights are open: waiters can follow the prefill
        # (the built head is remembered there, before the flight ends: its waiters read it as they wake)
        build.add_done_callback(lambda t: self._builds.finish(key, stages, self._built(key, prep, t)))
        try:
            ref = await asyncio.shield(build)
        except HeadTooLong:
            prep.decision = self._heads.too_long(prep.req.model, prep.decision)
            return
        self._metrics.first_sight_seconds.observe(time.perf_counter() - started)
        if ref is None:
            return
        self._heads.remember(key)
        prep.built = ref
        head_blocks = prompt.head_chars // self._config.block_chars
        if restored is not None:  # built on top of a restored stage snapshot: say which one
            prep.decision = replace(prep.decision, action=Action.RESTORE, snapshot=restored.snapshot,
                                    predicted_blocks=head_blocks, branch=Branch.RESTORE_FIRST_SIGHT)
        else:
            prep.decision = replace(prep.decision, action=Action.COMPUTE, snapshot=None,
                                    predicted_blocks=head_blocks, branch=Branch.FIRST_SIGHT)

    async def _detach(
        self, prep: Preparation, prompt: Prompt, key: FlightKey, base: SnapshotRef,
        learn: Coroutine[Any, Any, list[int]], known: frozenset[tuple[str, int]], lender: SlotLender,
    ) -> tuple[bool, list[int]]:
        """Build the head in a lent slot from `base` and forward now; False when no slot was lent. With
        the family's learned cuts, read either way."""
        # Claimed before any await (the family's read, the lender's schedule and leases): a session
        # joining the flight meanwhile goes on as decided rather than waiting.
        self._detached.claim(key)
        lent = None
        try:
            extra = await learn
            lent = await lender.lend(prep.req)
        finally:
            if lent is None:
                self._detached.unclaim(key)
        if lent is None:
            return False, extra
        self._primed.take(lent.decision.slot_ref)  # the build overwrites what it was primed with
        self._detached.start(prep.req, prompt, key, base, lent, prep.agents, extra, known)
        self._builds.computing(key)
        detached = Branch.RESTORE_FIRST_SIGHT_DETACHED if prep.restored else Branch.FIRST_SIGHT_DETACHED
        prep.decision = replace(prep.decision, branch=detached)
        return True, extra

    def _built(self, key: FlightKey, prep: Preparation, task: asyncio.Future[SnapshotRef | None],
               ) -> SnapshotRef | None:
        if task.cancelled():
            return None
        exc = task.exception()
        if isinstance(exc, HeadTooLong):
            self._heads.remember_too_long(key, prep.req.model, exc)
        return None if exc is not None else task.result()

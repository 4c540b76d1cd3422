"""The small snapshot steps: ship a wanted snapshot here, restore the decided one, prime after a build.
(First sight, the large one, is first_sight_step.py.)"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from llamafleet_core.types import Action, SnapshotRef
from llamafleet_router.scheduling.framework import Branch
from llamafleet_router.snapshots.base import SnapshotConfig
from llamafleet_router.snapshots.detached import DetachedBuilds, SlotLender
from llamafleet_router.snapshots.heads import HeadMemory
from llamafleet_router.snapshots.preparation import Preparation
from llamafleet_router.snapshots.prime import Primer
from llamafleet_router.snapshots.restore import Restored, RestoreExecutor, RestoreFailure
from llamafleet_router.snapshots.ship import Shipper


class ShipStep:
    """A snapshot on another pod would have served this pod better (`Decision.wanted`): copy it here in
    the background, for the next request (ship.py)."""

    def __init__(self, shipper: Shipper, config: SnapshotConfig) -> None:
        self._shipper = shipper
        self._config = config

    async def run(self, prep: Preparation) -> None:
        wanted, req = prep.decision.wanted, prep.req
        if wanted is not None and self._config.ship:
            blocks = req.prompt.blocks[: wanted.n_blocks]
            self._shipper.ship(req.model, wanted, blocks, prep.target, prep.agents)


class RestoreStep:
    """RESTORE decided: pull the snapshot from its pod if needed and restore it into the slot, or use
    what priming loaded there. On failure the request is computed (`restore_failed`) and goes on.

    On a --slot-attach pod, requests that come while another one restores the same snapshot there wait
    for that restore and then go on directly (`pod_hit`): the server attaches the restored slot's cells,
    and the pool holds the snapshot once instead of once per session (three sessions at once of a head
    known from disk held three copies). If that restore fails, each restores on its own."""

    def __init__(self, restorer: RestoreExecutor, primer: Primer, heads: HeadMemory) -> None:
        self._restorer = restorer
        self._primer = primer
        self._heads = heads
        # (pod uid, snapshot name) -> whether the restore under way there succeeds (--slot-attach pods)
        self._restoring: dict[tuple[str, str], asyncio.Future[bool]] = {}

    async def run(self, prep: Preparation) -> None:
        decision, req = prep.decision, prep.req
        snap = decision.snapshot
        if decision.action is not Action.RESTORE or snap is None:
            return
        if 0 < prep.slot_context <= snap.n_tokens:
            # Built on a pod with larger slots: this pod's server would refuse it (and the index would
            # then drop a snapshot good elsewhere), and the prompt, which extends it, too: nothing to do.
            computed = replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0)
            prep.settle(self._heads.too_long(req.model, computed))
            return
        key = (prep.target.uid, snap.name)
        running = self._restoring.get(key) if prep.target.attach else None
        if running is not None and await asyncio.shield(running):
            prep.decision = replace(decision, action=Action.DIRECT, snapshot=None, branch=Branch.POD_HIT)
            return
        reused = await self._primer.reuse(req.model, req.prompt.blocks, prep.target.url, decision.slot_ref,
                                          snap, prep.primed)
        outcome: Restored | RestoreFailure
        if reused is not None:  # loaded ahead of demand (prime.py) and untouched since
            outcome, decision = reused, replace(decision, snapshot=reused.snapshot, branch=Branch.PRIMED)
        elif prep.target.attach and key not in self._restoring:
            outcome = await self._restore_shared(key, prep, snap)
        else:
            outcome = await self._restorer.restore(req.model, req.prompt.blocks, prep.target, decision.slot,
                                                   snap, prep.agents)
        if isinstance(outcome, Restored):
            prep.decision, prep.restored = decision, outcome
        else:
            prep.failed = snap
            prep.decision = replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0,
                                    branch=Branch.RESTORE_FAILED)


    async def _restore_shared(self, key: tuple[str, str], prep: Preparation,
                              snap: SnapshotRef) -> Restored | RestoreFailure:
        """The restore, with the requests that come meanwhile for the same snapshot on this pod waiting
        for it (they attach its cells); they restore on their own if it fails or is cancelled."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._restoring[key] = done
        restored = False
        try:
            outcome = await self._restorer.restore(prep.req.model, prep.req.prompt.blocks, prep.target,
                                                   prep.decision.slot, snap, prep.agents)
            restored = isinstance(outcome, Restored)
            return outcome
        finally:
            del self._restoring[key]
            done.set_result(restored)


class PrimeStep:
    """After this request built its head: load the snapshot into up to `prime_slots` idle slots of its
    pod, once the request answers (prime.py); not on a --slot-attach pod."""

    def __init__(self, primer: Primer, lender: SlotLender | None, detached: DetachedBuilds,
                 config: SnapshotConfig) -> None:
        self._primer = primer
        self._lender = lender
        self._detached = detached
        self._config = config

    async def run(self, prep: Preparation) -> None:
        # A --slot-attach pod shares the head's cells with every slot that asks: priming would copy it.
        if prep.built is None or self._lender is None or prep.target.attach:
            return
        req = prep.req
        self._primer.start(req, prep.built, prep.pods, prep.agents, self._lender, self._config.prime_slots,
                           after=self._detached.answered(req.request_id))

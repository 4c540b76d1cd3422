"""The small snapshot steps: ship a wanted snapshot here, restore the decided one, prime after a build.
(First sight, the large one, is first_sight_step.py.)"""

from __future__ import annotations

from dataclasses import replace

from llamafleet_core.types import Action
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
    what priming loaded there. On failure the request is computed (`restore_failed`) and goes on."""

    def __init__(self, restorer: RestoreExecutor, primer: Primer, heads: HeadMemory) -> None:
        self._restorer = restorer
        self._primer = primer
        self._heads = heads

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
        reused = await self._primer.reuse(req.model, req.prompt.blocks, prep.target.url, decision.slot_ref,
                                          snap, prep.primed)
        outcome: Restored | RestoreFailure
        if reused is not None:  # loaded ahead of demand (prime.py) and untouched since
            outcome, decision = reused, replace(decision, snapshot=reused.snapshot, branch=Branch.PRIMED)
        else:
            outcome = await self._restorer.restore(req.model, req.prompt.blocks, prep.target, decision.slot,
                                                   snap, prep.agents)
        if isinstance(outcome, Restored):
            prep.decision, prep.restored = decision, outcome
        else:
            prep.failed = snap
            prep.decision = replace(decision, action=Action.COMPUTE, snapshot=None, predicted_blocks=0,
                                    branch=Branch.RESTORE_FAILED)


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

"""Restores on a --slot-attach pod are shared: requests that come while another one restores the same
snapshot there wait for it and go on directly (the server attaches the restored cells), so the pool holds
the snapshot once. On other pods, and for a failed restore, each request restores on its own.

The restorer is a stand-in that records calls and finishes when told: what is under test is the step's
bookkeeping, not how a restore runs (that is tested against real agents and servers elsewhere)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from llamafleet_core.types import Action, SnapshotRef
from llamafleet_router.scheduling.data import Branch
from llamafleet_router.scheduling.framework import Decision, SchedRequest
from llamafleet_router.snapshots.preparation import Preparation
from llamafleet_router.snapshots.restore import Restored, RestoreFailure
from llamafleet_router.snapshots.steps import RestoreStep
from tests.router.scheduling.fakes import MODEL, chain, endpoint, prompt

SNAP = SnapshotRef(name="head", pod_uid="uid-a", n_blocks=8, n_tokens=512, size_bytes=1000)


@dataclass
class _Restorer:
    succeed: bool = True
    calls: list[int] = field(default_factory=list)  # the slots restored into
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def restore(self, model: str, blocks: Any, target: Any, slot: int, snap: SnapshotRef,
                      agents: Any) -> Restored | RestoreFailure:
        self.calls.append(slot)
        self.started.set()
        await self.release.wait()
        if self.succeed:
            return Restored(snapshot=snap, n_tokens=snap.n_tokens, pulled=False, seconds=0.01)
        return RestoreFailure(op="restore", kind="checksum", reason="test")


class _NoPrimer:
    async def reuse(self, *args: Any) -> None:
        return None


def _prep(slot: int, *, attach: bool) -> Preparation:
    req = SchedRequest(f"r{slot}", MODEL, prompt(MODEL, chain("p", 12)), None)
    decision = Decision(endpoint("a", attach=attach), slot, Action.RESTORE, SNAP, SNAP.n_blocks,
                        Branch.RESTORE)
    return Preparation(req, decision, pods=[], agents={}, slot_context=0)


def _step(restorer: _Restorer) -> RestoreStep:
    return RestoreStep(restorer, _NoPrimer(), heads=None)  # type: ignore[arg-type]


async def test_on_an_attach_pod_the_others_wait_for_one_restore_and_go_on_directly() -> None:
    restorer = _Restorer()
    step = _step(restorer)
    first, second, third = _prep(0, attach=True), _prep(1, attach=True), _prep(2, attach=True)
    leading = asyncio.create_task(step.run(first))
    await restorer.started.wait()
    # scheduled before the restore can end: they find it under way
    waiting = [asyncio.create_task(step.run(p)) for p in (second, third)]
    restorer.release.set()
    await asyncio.gather(leading, *waiting)
    assert restorer.calls == [0]
    assert first.decision.action is Action.RESTORE and first.restored is not None
    for prep in (second, third):
        assert (prep.decision.action, prep.decision.branch) == (Action.DIRECT, Branch.POD_HIT)
        assert prep.decision.predicted_blocks == SNAP.n_blocks and prep.restored is None


async def test_when_the_shared_restore_fails_each_waiter_restores_on_its_own() -> None:
    restorer = _Restorer(succeed=False)
    step = _step(restorer)
    first, second = _prep(0, attach=True), _prep(1, attach=True)
    leading = asyncio.create_task(step.run(first))
    await restorer.started.wait()
    waiting = asyncio.create_task(step.run(second))
    restorer.release.set()
    await asyncio.gather(leading, waiting)
    assert restorer.calls == [0, 1]
    assert first.decision.branch == second.decision.branch == Branch.RESTORE_FAILED


async def test_pods_without_attach_restore_into_every_slot() -> None:
    restorer = _Restorer()
    restorer.release.set()
    step = _step(restorer)
    preps = [_prep(slot, attach=False) for slot in range(3)]
    await asyncio.gather(*(step.run(p) for p in preps))
    assert sorted(restorer.calls) == [0, 1, 2]
    assert all(p.restored is not None for p in preps)

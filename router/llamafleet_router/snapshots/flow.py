"""What the gateway does with a claimed slot before it forwards a request: `SnapshotFlow.prepare`.

The flow is a list of before-request steps run in order over one `Preparation` (preparation.py):
1. ship (steps.py): a snapshot another pod holds, that would have served this pod better, is copied
   here in the background;
2. restore (steps.py): RESTORE decided: the snapshot goes into the slot (or priming already put it
   there); on failure the request is computed;
3. first sight (first_sight_step.py): a long head nobody has a snapshot of is built once, by one
   request; the others wait for it or for a stage they share;
4. prime (steps.py): a head just built is loaded into idle slots of its pod for the burst's next
   sessions.
Every collaborator is built here, once, from the pods' HTTP client, the index and the slot lender the
gateway gives; no step calls back into the gateway. `prepare` never raises (except cancellation): the
index is a hint and the request must be served.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from llamafleet_core.index.base import PrefixIndex
from llamafleet_router.background import TaskSet
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.scheduling.framework import ANY_SLOT, Branch, Decision, SchedRequest
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.detached import DetachedBuilds, SlotLender
from llamafleet_router.snapshots.families import HeadFamilies
from llamafleet_router.snapshots.first_sight import StagedPrefill
from llamafleet_router.snapshots.first_sight_step import FirstSightStep
from llamafleet_router.snapshots.flights import Flights, StageFlights
from llamafleet_router.snapshots.heads import HeadMemory
from llamafleet_router.snapshots.leader import Leader
from llamafleet_router.snapshots.peers import peer_agents
from llamafleet_router.snapshots.preparation import Preparation, Step, slot_context
from llamafleet_router.snapshots.prime import PrimedSlots, Primer
from llamafleet_router.snapshots.restore import RestoreExecutor
from llamafleet_router.snapshots.resync import Resync
from llamafleet_router.snapshots.ship import Shipper
from llamafleet_router.snapshots.steps import PrimeStep, RestoreStep, ShipStep
from llamafleet_router.snapshots.waits import BuildWaits, HeadBuilds

log = logging.getLogger(__name__)


class SnapshotFlow:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, config: SnapshotConfig,
        metrics: SnapshotMetrics, tasks: TaskSet, speeds: SpeedBook | None = None,
        lender: SlotLender | None = None,
    ) -> None:
        """`lender`: idle slots for background builds (detached first sight, priming); without one,
        every build runs in the request's own slot and nothing is primed."""
        self.config = config
        self.metrics = metrics
        self.restorer = RestoreExecutor(http=http, index=index, token=config.agent_token, metrics=metrics,
                                        tasks=tasks, speeds=speeds)
        self.staged = StagedPrefill(http=http, index=index, config=config, metrics=metrics)
        self.resync = Resync(http=http, index=index, config=config, metrics=metrics)
        self.flights = Flights()
        self.builds = HeadBuilds(self.flights, StageFlights(self.flights, config), config, speeds)
        self.heads = HeadMemory(metrics)
        self.primer = Primer(http=http, index=index, restorer=self.restorer, metrics=metrics, tasks=tasks,
                             slots=PrimedSlots(), api_key=config.pod_api_key)
        self._detached = DetachedBuilds(
            config=config, metrics=metrics, tasks=tasks, restorer=self.restorer, staged=self.staged,
            stage_flights=self.builds.stage_flights, remember=self.heads.remember, finish=self.builds.finish,
            index=index)
        families = HeadFamilies(index=index, tasks=tasks, config=config)
        leader = Leader(
            staged=self.staged, builds=self.builds, families=families,
            detached=self._detached, heads=self.heads, primed=self.primer.slots, lender=lender, config=config,
            metrics=metrics)
        self.steps: tuple[Step, ...] = (
            ShipStep(Shipper(restorer=self.restorer, metrics=metrics, tasks=tasks), config),
            RestoreStep(self.restorer, self.primer, self.heads),
            FirstSightStep(builds=self.builds, leader=leader, detached=self._detached,
                           heads=self.heads, config=config, metrics=metrics,
                           waits=BuildWaits(self.builds, self.restorer, metrics, config,
                                            idle_pods=lender.idle_pods if lender is not None else None)),
            PrimeStep(self.primer, lender, self._detached, config),
        )

    async def prepare(self, req: SchedRequest, decision: Decision, pods: Sequence[PodStatus], *,
                      may_move: bool = True) -> Decision:
        """The decision to forward `req` with, once its slot is ready; `Branch.FIRST_SIGHT_MOVED` (only
        when `may_move`): not here, schedule it again without this pod (waits.py)."""
        if decision.slot == ANY_SLOT:
            return decision
        primed = self.primer.slots.take(decision.slot_ref)  # the request changes what the slot holds
        target = decision.endpoint
        # Without restores (`Endpoint.restores`) no step has anything to do: a snapshot could never be used.
        if decision.branch == Branch.QUEUED or target.agent_url is None or not target.restores:
            return decision
        prep = Preparation(req, decision, pods, peer_agents(pods, target, self.config.tokens),
                           slot_context(pods, target), primed, may_move=may_move)
        try:
            for step in self.steps:
                if prep.settled:
                    break
                await step.run(prep)
        except Exception:
            log.exception("snapshot preparation failed; forwarding as decided so far")
        return prep.decision

    def request_answering(self, request_id: str) -> None:
        """The gateway's signal that a request answers (its first byte) or ended: a build detached from
        it, or a priming after its build, may start now."""
        self._detached.request_answering(request_id)

    def expected_build_s(self, chars: int, pod_uid: str) -> float:
        return self.builds.expected_s(chars, pod_uid)

    def wait_limit(self, expected_s: float) -> float:
        return self.builds.wait_limit(expected_s)

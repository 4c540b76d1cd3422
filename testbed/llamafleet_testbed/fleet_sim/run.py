"""The fleet simulator's run: simulated pods behind the real scheduler, the real index and a real Redis.

Discrete events in simulated time: a session arrives, a turn is sent, a turn ends, a pod leaves and
another joins. A turn is rendered by the gateway's own code (`chat_identity`) and scheduled by its own
`Scheduler` (the default pipeline, the prefix index and the slot leases on the given Redis) over the
router's own views of the pods (`fleet.state`: its in-flight books, begun at dispatch and ended with the
answer, and `endpoint_states`). The slot records and the lease's release are the router's own
(`request.after.AfterResponse`): a provisional record at dispatch, the answer checked against it (and
recorded again only where the router would), then the lease goes back. Only the decision (the views,
then `Scheduler.schedule`) is timed, on the wall clock; simulated time costs nothing, so an hour of a
1,000-pod fleet runs in minutes. A leaving pod's entries are purged, as discovery's fence does, and its
sessions find their slots gone.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from llamafleet_core.index.base import PrefixIndex, SlotLeases
from llamafleet_core.prefix import ChatTemplate, PromptIdentity, chat_identity
from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.background import IndexHealth
from llamafleet_router.discovery.base import PodProps, PodStatus
from llamafleet_router.fleet.state import InFlight, endpoint_states
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.proxy.sse import Stats
from llamafleet_router.request.after import AfterResponse
from llamafleet_router.scheduling.config import default_config
from llamafleet_router.scheduling.framework import ANY_SLOT, Decision, SchedRequest
from llamafleet_router.scheduling.scheduler import Scheduler
from llamafleet_testbed.fleet_sim.servers import Served, ServerTiming, SimPod, shared_blocks
from llamafleet_testbed.fleet_sim.traffic import Arrivals, Session, TrafficSpec, build_prefixes

MODEL = "sim"


@dataclass(frozen=True)
class FleetSpec:
    pods: int = 1000
    slots: int = 4
    minutes: float = 5.0  # simulated
    churn_per_hour: float = 60.0  # pods leaving (each replaced by a new one)
    block_chars: int = 256  # the router's default


@dataclass
class Tally:
    """What the run counts, beside the decisions' wall times (milliseconds)."""

    decision_ms: list[float] = field(default_factory=list)
    branches: Counter[str] = field(default_factory=Counter)
    computed_tokens: int = 0
    minimum_tokens: int = 0
    cached_tokens: int = 0
    sessions: int = 0
    pods_replaced: int = 0
    heads_seen: set[str] = field(default_factory=set)
    collections: int = 0  # garbage collections in the run
    collections_in_decisions: int = 0  # of those, the ones that ran inside a timed decision
    collection_ms_in_decisions: float = 0.0


@dataclass
class _Turn:
    session: Session
    req: SchedRequest
    question: str
    decision: Decision
    pod: SimPod
    slot: int
    served: Served


class FleetSim:
    def __init__(self, fleet: FleetSpec, traffic: TrafficSpec, timing: ServerTiming, *, index: PrefixIndex,
                 leases: SlotLeases, template: ChatTemplate, score_every_pod: bool = False) -> None:
        """`score_every_pod`: the scheduler's reference mode (`Scheduler`), the simulator's baseline."""
        self.fleet, self.traffic, self.timing = fleet, traffic, timing
        self.index, self.template = index, template
        self.scheduler = Scheduler(default_config(), index=index, leases=leases, holder_prefix="sim",
                                   score_every_pod=score_every_pod)
        self.profiles = build_prefixes(traffic)
        self.arrivals = Arrivals(traffic)
        self.tally = Tally()
        self._rng = random.Random(traffic.seed + 17)
        self._uids = itertools.count()
        self.pods: dict[str, SimPod] = {}
        self.statuses: dict[str, PodStatus] = {}  # what discovery would say of each pod
        metrics = RouterMetrics(CollectorRegistry())
        self.in_flight = InFlight(metrics)
        self.after = AfterResponse(index=index, scheduler=self.scheduler, metrics=metrics,
                                   health=IndexHealth(index, metrics, 60.0), block_chars=fleet.block_chars,
                                   chars_per_token=timing.chars_per_token)
        self._events: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()
        self._last_prompt: dict[int, tuple[str, ...]] = {}  # per session: its previous turn's chain
        self._deciding = False  # a decision is being timed (what a collection's callback charges)
        self._collection_started: float | None = None
        for _ in range(fleet.pods):
            self._join()

    def _join(self) -> None:
        uid = f"pod-{next(self._uids)}"
        self.pods[uid] = SimPod(uid, self.fleet.slots)
        endpoint = Endpoint(PodRef(uid, uid, 0), f"http://{uid}:8080", MODEL, self.fleet.slots)
        self.statuses[uid] = PodStatus(endpoint, PodProps(MODEL, self.fleet.slots))

    def _at(self, when: float, kind: str, data: Any = None) -> None:
        heapq.heappush(self._events, (when, next(self._order), kind, data))

    async def run(self, say: Callable[[str], None] = lambda _: None) -> Tally:
        gc.callbacks.append(self._on_collection)
        try:
            return await self._run(say)
        finally:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        """Count the collections, and the time of those inside a decision: the part of the decisions'
        tail that is the collector's, not the scheduler's."""
        if phase == "start":
            self.tally.collections += 1
            self._collection_started = time.perf_counter() if self._deciding else None
        elif self._collection_started is not None:
            self.tally.collections_in_decisions += 1
            self.tally.collection_ms_in_decisions += (time.perf_counter() - self._collection_started) * 1000
            self._collection_started = None

    async def _run(self, say: Callable[[str], None]) -> Tally:
        end = self.fleet.minutes * 60.0
        self._at(self.arrivals.next_gap_s(), "arrive")
        if self.fleet.churn_per_hour > 0:
            self._at(self._rng.expovariate(self.fleet.churn_per_hour / 3600.0), "churn")
        reported = time.monotonic()
        while self._events:
            now, _, kind, data = heapq.heappop(self._events)
            if now > end:
                break
            if kind == "arrive":
                session = self.arrivals.session()
                self.tally.sessions += 1
                self._at(now, "turn", session)
                self._at(now + self.arrivals.next_gap_s(), "arrive")
            elif kind == "turn":
                await self._turn(data, now)
            elif kind == "done":
                await self._done(data, now)
            elif kind == "churn":
                await self._churn(now)
                self._at(now + self._rng.expovariate(self.fleet.churn_per_hour / 3600.0), "churn")
            if time.monotonic() - reported > 30.0:
                reported = time.monotonic()
                say(f"simulated {now / 60:.1f} of {self.fleet.minutes:g} minutes, "
                    f"{len(self.tally.decision_ms)} decisions")
        return self.tally

    async def _turn(self, session: Session, now: float) -> None:
        body, question = session.request(self.profiles, MODEL, self.traffic.answer_tokens)
        identity = chat_identity(body, self.template, model=MODEL, block_chars=self.fleet.block_chars)
        req = SchedRequest(f"s{session.id}-{session.turns_left}", MODEL, identity)
        pods = list(self.statuses.values())  # discovery's list, which the router copies per request too
        self._deciding, started = True, time.perf_counter()
        try:
            decision = await self.scheduler.schedule(req, endpoint_states(MODEL, pods, self.in_flight))
        finally:
            self._deciding = False
        self.tally.decision_ms.append((time.perf_counter() - started) * 1000)
        self.tally.branches[decision.branch] += 1
        uid = decision.endpoint.pod.uid
        pod = self.pods[uid]
        slot = decision.slot if decision.slot != ANY_SLOT else min(
            range(pod.n_slots), key=lambda s: pod.slots[s].busy_until)
        await self.after.dispatched(req, decision)  # the router's provisional record, as it forwards
        served = pod.serve(slot, tuple(identity.blocks), len(identity.text), self.traffic.answer_tokens, now,
                           self.timing, self.fleet.block_chars)
        self._count(session, identity, served.computed_tokens, served.cached_tokens)
        self.in_flight.begin(uid, uid, decision.slot)
        self._at(served.done_at, "done", _Turn(session, req, question, decision, pod, slot, served))

    def _count(self, session: Session, identity: PromptIdentity, computed: int, cached: int) -> None:
        """Tokens computed, and the least any placement could have computed: a session's later turn
        could resume its previous turn's prompt, a first turn the head if any session had sent it."""
        tally, chars = self.tally, self.timing.chars_per_token
        blocks = tuple(identity.blocks)
        previous = self._last_prompt.get(session.id)
        if previous is not None:
            could = shared_blocks(previous, blocks)
        else:
            head = identity.head_tag or ""
            could = identity.shared_chars // self.fleet.block_chars if head in tally.heads_seen else 0
            tally.heads_seen.add(head)
        prompt_tokens = max(1, round(len(identity.text) / chars))
        tally.minimum_tokens += prompt_tokens - min(prompt_tokens - 1, round(could * self.fleet.block_chars
                                                                             / chars))
        tally.computed_tokens += computed
        tally.cached_tokens += cached
        self._last_prompt[session.id] = blocks

    async def _done(self, turn: _Turn, now: float) -> None:
        uid = turn.pod.uid
        if uid in self.pods:  # (a pod that left meanwhile took the slot with it)
            stats = Stats(cache_n=turn.served.cached_tokens, prompt_n=turn.served.computed_tokens,
                          predicted_n=self.traffic.answer_tokens)
            outcome = Outcome(status=200, stats=stats, completed=True, served_slot=turn.slot)
            await self.after.finished(turn.req, turn.decision, outcome)
            self.in_flight.end(uid, uid, turn.decision.slot)
        await self.after.release(turn.decision)
        turn.session.answered(turn.question)
        if turn.session.turns_left > 0:
            self._at(now + self.arrivals.think_s(), "turn", turn.session)
        else:
            self._last_prompt.pop(turn.session.id, None)

    async def _churn(self, now: float) -> None:
        uid = self._rng.choice(sorted(self.pods))
        del self.pods[uid], self.statuses[uid]
        await self.index.purge_pod(uid)
        self._join()
        self.tally.pods_replaced += 1

"""Concurrent first sessions of one never-seen head (issue 23): waiters wait as long as the leader's
build is expected to take (its pod's learned prefill rate, a slow CPU figure for an unknown pod), not a
fixed 120 s, and one whose wait passes while the leader still builds on its own pod waits on rather
than computing the head beside the build. llama-server is an httpx MockTransport (MockPods: it
tokenizes only when the test lets it, and refuses prefills); timing is held by its event, not sleeps."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llamafleet_core.index import InMemoryPrefixIndex
from llamafleet_core.types import Action, Endpoint
from llamafleet_router.background import TaskSet
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.scheduling.framework import Decision, SchedRequest
from llamafleet_router.scheduling.speeds import SpeedBook
from llamafleet_router.snapshots import SnapshotConfig, SnapshotFlow, SnapshotMetrics
from llamafleet_router.snapshots import waits as waits_module
from tests.router.test_head_context_units import MockPods, cold, status
from tests.router.test_snapshot_units import SYSTEM, identity, pod

FLOOR_S = 0.05  # the configured least wait: what the old fixed limit stands for here, scaled down
HEAD_TOKENS = len(SYSTEM) / 4  # the cost model's 4 characters a token


def learned(speeds: SpeedBook, endpoint: Endpoint, tokens_per_s: float) -> None:
    """Teach `speeds` a full-batch prefill rate for the pod (two answers: `min_samples`)."""
    for _ in range(2):
        speeds.observe_prompt(endpoint, identity(), cached=0, computed=1000, seconds=1000 / tokens_per_s)


def flow_with(mock: MockPods, speeds: SpeedBook, ceiling_s: float) -> SnapshotFlow:
    config = SnapshotConfig(token="t", first_sight_wait_s=ceiling_s, first_sight_wait_min_s=FLOOR_S)
    return SnapshotFlow(http=httpx.AsyncClient(transport=httpx.MockTransport(mock)),
                        index=InMemoryPrefixIndex(), config=config,
                        metrics=SnapshotMetrics(CollectorRegistry()), tasks=TaskSet(), speeds=speeds)


@pytest.fixture(autouse=True)
def no_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits_module, "WAIT_MARGIN_S", 0.0)  # limits of milliseconds, not seconds


async def lead(flow: SnapshotFlow, mock: MockPods, target: Endpoint, pods: list[PodStatus],
               req: SchedRequest | None = None) -> asyncio.Task[Decision]:
    """Start the leader's build; it holds in `/tokenize` until `mock.release` is set."""
    mock.release.clear()
    req = req or SchedRequest("r1", "m", identity())
    leader = asyncio.create_task(flow.prepare(req, cold(target, 1), pods))
    await asyncio.wait_for(mock.tokenizing.wait(), 5)
    return leader


async def still_waiting(task: asyncio.Task[Decision], seconds: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(task), seconds)
    except TimeoutError:
        return True
    return False


def test_the_wait_follows_the_expected_build_within_floor_and_ceiling() -> None:
    speeds = SpeedBook(ActionCosts())
    flow = flow_with(MockPods(), speeds, ceiling_s=600.0)
    slow, fast, unknown = pod("slow"), pod("fast"), pod("new")
    learned(speeds, slow, 40.0)
    learned(speeds, fast, 100_000.0)
    assert flow.expected_build_s(len(SYSTEM), slow.uid) == pytest.approx(HEAD_TOKENS / 40.0)
    # An unknown pod is assumed a slow CPU pod, not the cost model's 2,000 tokens/s: a 16K-token head
    # is expected to take 80 s there, so its waiters wait 160 s plus the margin rather than giving up.
    rate = waits_module.UNKNOWN_POD_PREFILL_TOKENS_PER_S
    assert rate < ActionCosts().prefill_tokens_per_s
    assert flow.expected_build_s(len(SYSTEM), unknown.uid) == pytest.approx(HEAD_TOKENS / rate)
    assert flow.expected_build_s(64_000, unknown.uid) == pytest.approx(80.0)
    assert flow.wait_limit(80.0) == pytest.approx(160.0)  # (margin 0 here)
    assert flow.wait_limit(0.0) == FLOOR_S
    assert flow.wait_limit(10_000.0) == 600.0  # the ceiling: `first_sight_wait_s`


async def test_a_slow_but_expected_build_keeps_its_waiters_past_the_floor() -> None:
    """The leader's pod learned 40 tokens/s: the head is expected to take ~30 s, so a waiter on another
    pod still waits after 10x the floor (the old fixed limit, scaled), and is woken by the build's end."""
    mock, speeds = MockPods(), SpeedBook(ActionCosts())
    flow = flow_with(mock, speeds, ceiling_s=600.0)
    leader_pod, other = pod("p0"), pod("p1")
    learned(speeds, leader_pod, 40.0)
    pods = [status(leader_pod, 0), status(other, 0)]
    leader = await lead(flow, mock, leader_pod, pods)
    waiter = asyncio.create_task(flow.prepare(SchedRequest("r2", "m", identity()), cold(other, 2), pods))
    assert await still_waiting(waiter, 10 * FLOOR_S)
    mock.release.set()  # the build ends (the mock refuses its prefill: no snapshot)
    await leader
    decision = await asyncio.wait_for(waiter, 5)
    assert (decision.endpoint, decision.branch) == (other, "cold")
    assert flow.metrics.first_sight.labels("waiter")._value.get() == 1


async def test_a_fast_pods_build_lets_a_waiter_elsewhere_go_on_at_the_floor() -> None:
    """Same, but the leader's pod learned a fast rate: the wait passes at the floor, and the waiter,
    on another pod than the build, computes there."""
    mock, speeds = MockPods(), SpeedBook(ActionCosts())
    flow = flow_with(mock, speeds, ceiling_s=600.0)
    leader_pod, other = pod("p0"), pod("p1")
    learned(speeds, leader_pod, 100_000.0)
    pods = [status(leader_pod, 0), status(other, 0)]
    leader = await lead(flow, mock, leader_pod, pods)
    decision = await asyncio.wait_for(
        flow.prepare(SchedRequest("r2", "m", identity()), cold(other, 2), pods), 5)
    assert (decision.endpoint, decision.action, decision.branch) == (other, Action.COMPUTE, "cold")
    mock.release.set()
    await leader


async def test_a_waiter_on_the_leaders_pod_waits_for_the_build_past_its_own_limit() -> None:
    """Its own limit passed (a fast pod), but computing the head beside the build would only slow both:
    it waits on, up to the ceiling, and is woken by the build."""
    mock, speeds = MockPods(), SpeedBook(ActionCosts())
    flow = flow_with(mock, speeds, ceiling_s=600.0)
    leader_pod = pod("p0")
    learned(speeds, leader_pod, 100_000.0)
    pods = [status(leader_pod, 0)]
    leader = await lead(flow, mock, leader_pod, pods)
    waiter = asyncio.create_task(flow.prepare(SchedRequest("r2", "m", identity()), cold(leader_pod, 2), pods))
    assert await still_waiting(waiter, 20 * FLOOR_S)  # 20 times its own limit (a fast pod's: the floor)
    mock.release.set()
    await leader
    decision = await asyncio.wait_for(waiter, 5)
    assert (decision.endpoint, decision.slot, decision.branch) == (leader_pod, 2, "cold")


class IdlePods:
    """The gateway's lender as far as waiters use it: which other pods have an idle slot now."""

    def __init__(self, *idle: Endpoint) -> None:
        self.idle = list(idle)
        self.asked: list[str] = []

    async def lend(self, req: SchedRequest, **kwargs: object) -> None:
        return None  # no slot lent to background work here

    async def idle_pods(self, req: SchedRequest, pod_uid: str) -> list[Endpoint]:
        self.asked.append(pod_uid)
        return [e for e in self.idle if e.uid != pod_uid]


# A head with a stage point 43% in (a day's date line): a build that has not saved it after t seconds
# needs at least 1.3 t more, and at the waiter's floor that is longer than a fast idle pod's whole head.
EARLY_STAGE_SYSTEM = ("<|im_start|>system\n" + "Tools and rules. " * 130
                      + "\n\nConversation started: Monday. " + "More rules here. " * 170 + "<|im_end|>\n")
EARLY_STAGE_TEXT = EARLY_STAGE_SYSTEM + "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def early_stage(request_id: str) -> SchedRequest:
    return SchedRequest(request_id, "m", identity(EARLY_STAGE_TEXT, len(EARLY_STAGE_SYSTEM)))


def flow_lending(mock: MockPods, speeds: SpeedBook, lender: IdlePods) -> SnapshotFlow:
    config = SnapshotConfig(token="t", first_sight_wait_s=600.0, first_sight_wait_min_s=FLOOR_S)
    return SnapshotFlow(http=httpx.AsyncClient(transport=httpx.MockTransport(mock)),
                        index=InMemoryPrefixIndex(), config=config,
                        metrics=SnapshotMetrics(CollectorRegistry()), tasks=TaskSet(), speeds=speeds,
                        lender=lender)  # type: ignore[arg-type]


def test_what_a_build_still_needs_is_read_from_its_progress() -> None:
    build = waits_module.Build("p0", started=100.0, expected_s=1.0, from_chars=1000, to_chars=11_000)
    # 2,000 characters saved in 4 s: the other 8,000 at that rate, less what passed since the save
    assert waits_module.remaining_s(build, (3000, 104.0), None, now=105.0) == pytest.approx(15.0)
    assert waits_module.remaining_s(build, (3000, 104.0), None, now=200.0) == 0.0
    # nothing saved after 10 s though a stage lies 1,000 characters in: slower than 100 a second, so
    # the 9,000 past that stage take more than 90 s
    assert waits_module.remaining_s(build, None, 2000, now=110.0) == pytest.approx(90.0)
    assert waits_module.remaining_s(build, None, None, now=110.0) is None  # no stage to tell by
    assert waits_module.remaining_s(build, None, 11_000, now=110.0) is None  # (the head's end itself)


async def test_a_waiter_on_the_leaders_pod_moves_to_an_idle_pod_that_computes_the_head_sooner() -> None:
    """Its limit passed while the build on its own pod has not saved the stage 43% in: a pod with an
    idle slot that computes the whole head in less than the build can still need gets the request
    (`first_sight_moved`: the director schedules it again without the building pod)."""
    mock, speeds = MockPods(), SpeedBook(ActionCosts())
    leader_pod, idle = pod("p0"), pod("p1")
    learned(speeds, leader_pod, 100_000.0)  # a fast pod: the waiter's own limit is the floor
    learned(speeds, idle, 100_000.0)
    assert flow_with(mock, speeds, 600.0).expected_build_s(len(EARLY_STAGE_SYSTEM), idle.uid) < FLOOR_S
    lender = IdlePods(idle)
    flow = flow_lending(mock, speeds, lender)
    pods = [status(leader_pod, 0), status(idle, 0)]
    leader = await lead(flow, mock, leader_pod, pods, early_stage("r1"))
    decision = await asyncio.wait_for(flow.prepare(early_stage("r2"), cold(leader_pod, 2), pods), 5)
    assert (decision.endpoint, decision.slot, decision.branch) == (leader_pod, 2, "first_sight_moved")
    assert lender.asked == [leader_pod.uid] and flow.metrics.first_sight.labels("moved")._value.get() == 1
    mock.release.set()
    await leader


@pytest.mark.parametrize("case", ["idle pod slower", "no idle pod", "moved once already"])
async def test_a_waiter_stays_with_the_build_unless_an_idle_pod_is_sooner(case: str) -> None:
    """An idle pod that would take longer than the build can still need, none at all, or a request that
    moved once already: the waiter waits on for the build, and is woken by it."""
    mock, speeds = MockPods(), SpeedBook(ActionCosts())
    leader_pod, idle = pod("p0"), pod("p1")
    learned(speeds, leader_pod, 100_000.0)
    learned(speeds, idle, 1.0 if case == "idle pod slower" else 100_000.0)  # (learned: 40 tokens/s)
    flow = flow_lending(mock, speeds, IdlePods() if case == "no idle pod" else IdlePods(idle))
    pods = [status(leader_pod, 0), status(idle, 0)]
    leader = await lead(flow, mock, leader_pod, pods, early_stage("r1"))
    waiter = asyncio.create_task(flow.prepare(early_stage("r2"), cold(leader_pod, 2), pods,
                                              may_move=case != "moved once already"))
    assert await still_waiting(waiter, 20 * FLOOR_S)
    mock.release.set()
    await leader
    decision = await asyncio.wait_for(waiter, 5)
    assert (decision.endpoint, decision.branch) == (leader_pod, "cold")
    assert flow.metrics.first_sight.labels("moved")._value.get() == 0

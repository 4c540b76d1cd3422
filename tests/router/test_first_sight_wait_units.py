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
               ) -> asyncio.Task[Decision]:
    """Start the leader's build; it holds in `/tokenize` until `mock.release` is set."""
    mock.release.clear()
    leader = asyncio.create_task(flow.prepare(SchedRequest("r1", "m", identity()), cold(target, 1), pods))
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

"""A head longer than its pod's slot context: first sight never builds it, says so, and counts it; and
the per-pod slot-context gauge. llama-server is replaced by an httpx MockTransport: what is tested is
which calls the gateway makes, not what the server does with them (the real one: test_head_context_real)."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llamafleet_core.index import InMemoryPrefixIndex
from llamafleet_core.types import Action, Endpoint, Lookup
from llamafleet_router.background import TaskSet
from llamafleet_router.discovery.base import PodProps, PodStatus
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.scheduling.framework import Branch, Decision, SchedRequest
from llamafleet_router.snapshots import SnapshotConfig, SnapshotFlow, SnapshotMetrics
from llamafleet_router.snapshots.first_sight import likely_fits
from tests.router.test_snapshot_units import PROMPT_TEXT, SYSTEM, identity, pod, snap

HEAD_TOKENS = -(-len(SYSTEM) // 4)  # the mock's tokenizer: one token per 4 characters


class MockPods:
    """Answers `/tokenize` (4 characters a token, with pieces) and records every path called; any other
    call fails (a prefill or a save is then visible in `paths` and refused)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.tokenizing = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path != "/tokenize":
            return httpx.Response(500, json={"error": {"code": 500, "message": "not served by the mock"}})
        self.tokenizing.set()
        await self.release.wait()
        text = json.loads(request.content)["content"]
        pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
        return httpx.Response(200, json={"tokens": [{"id": i, "piece": p} for i, p in enumerate(pieces)]})


def status(endpoint: Endpoint, n_ctx: int) -> PodStatus:
    return PodStatus(endpoint, PodProps(model="m", total_slots=4, n_ctx=n_ctx))


def flow_of(mock: MockPods) -> tuple[SnapshotFlow, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(mock))
    flow = SnapshotFlow(http=http, index=InMemoryPrefixIndex(), config=SnapshotConfig(token="t"),
                        metrics=SnapshotMetrics(CollectorRegistry()), tasks=TaskSet())
    return flow, http


def too_long_count(flow: SnapshotFlow) -> float:
    return flow.metrics.head_too_long.labels("m")._value.get()


def cold(target: Endpoint, slot: int = 1) -> Decision:
    """A cold decision, made on an index lookup that knew nothing of the prompt."""
    return Decision(target, slot, Action.COMPUTE, None, 0, Branch.COLD, lookup=Lookup())


async def test_a_head_longer_than_the_slot_context_is_tokenized_once_and_never_prefilled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llamafleet_router.snapshots.flow")
    mock = MockPods()
    flow, http = flow_of(mock)
    target = pod("p0")
    small = [status(target, HEAD_TOKENS - 1)]  # one token short of the head: no room for the request

    first = await flow.prepare(SchedRequest("r1", "m", identity()), cold(target), small)
    assert (first.action, first.branch) == (Action.COMPUTE, "head_exceeds_context")
    assert mock.paths == ["/tokenize"]  # no prefill (not even the early first stage), no save
    assert too_long_count(flow) == 1

    again = await flow.prepare(SchedRequest("r2", "m", identity()), cold(target, 2), small)
    assert again.branch == "head_exceeds_context" and again.slot == 2
    assert mock.paths == ["/tokenize"]  # known too long: not tokenized again
    assert too_long_count(flow) == 2
    warnings = [r for r in caplog.records if "exceeds the slot context" in r.getMessage()]
    assert len(warnings) == 1  # one per head, however many requests send it
    assert (warnings[0].__dict__["head_tokens"], warnings[0].__dict__["slot_context"]) == (
        HEAD_TOKENS, HEAD_TOKENS - 1)

    # A pod whose slots hold the head does build it (here the mock refuses the prefill).
    roomy = [status(target, HEAD_TOKENS + 1000)]
    built = await flow.prepare(SchedRequest("r3", "m", identity()), cold(target, 3), roomy)
    assert built.branch != "head_exceeds_context" and "/completion" in mock.paths
    assert too_long_count(flow) == 2
    await http.aclose()


async def test_a_request_waiting_for_the_builder_of_a_too_long_head_says_so_too() -> None:
    mock = MockPods()
    mock.release.clear()
    flow, http = flow_of(mock)
    target = pod("p0")
    small = [status(target, 512)]
    leader = asyncio.create_task(flow.prepare(SchedRequest("r1", "m", identity()), cold(target, 1), small))
    await asyncio.wait_for(mock.tokenizing.wait(), 5)
    waiter = asyncio.create_task(flow.prepare(SchedRequest("r2", "m", identity()), cold(target, 2), small))
    waiting = flow.metrics.first_sight.labels("waiter")
    for _ in range(10_000):  # until the second request joined the leader's flight (counted as it joins)
        if waiting._value.get() >= 1:
            break
        await asyncio.sleep(0)
    assert waiting._value.get() == 1
    mock.release.set()
    assert (await leader).branch == "head_exceeds_context"
    assert (await waiter).branch == "head_exceeds_context"
    assert mock.paths == ["/tokenize"] and too_long_count(flow) == 2
    await http.aclose()


async def test_an_unknown_slot_context_changes_nothing() -> None:
    """A pod that did not report n_ctx (0): the build goes on as before, tried and not refused here."""
    mock = MockPods()
    flow, http = flow_of(mock)
    target = pod("p0")
    decision = await flow.prepare(SchedRequest("r1", "m", identity()), cold(target), [status(target, 0)])
    assert decision.branch != "head_exceeds_context" and "/completion" in mock.paths
    assert too_long_count(flow) == 0
    await http.aclose()


async def test_a_snapshot_longer_than_the_target_slot_context_is_not_restored() -> None:
    """Built on a pod with larger slots: the restore is skipped (its server would refuse it, and the
    index drop a snapshot good elsewhere) and the request goes on computing, named so."""
    mock = MockPods()
    flow, http = flow_of(mock)
    target = pod("p0")
    head = snap("fs-a", "p1", PROMPT_TEXT, len(SYSTEM))
    restore = Decision(target, 1, Action.RESTORE, head, 0, "restore")
    pods = [status(target, head.n_tokens)]
    decision = await flow.prepare(SchedRequest("r1", "m", identity()), restore, pods)
    assert (decision.action, decision.snapshot) == (Action.COMPUTE, None)
    assert decision.branch == "head_exceeds_context"
    assert mock.paths == [] and too_long_count(flow) == 1  # no pull, no restore, no first sight
    await http.aclose()


def test_a_head_likely_fits_below_four_characters_a_token() -> None:
    assert likely_fits("a" * 100_000, 0)  # unknown context: no check
    assert likely_fits("a" * 2047, 512) and not likely_fits("a" * 2048, 512)


def test_the_slot_context_gauge_follows_the_pods_reports() -> None:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    name = "llamafleet_router_pod_slot_context_tokens"
    a, b, c = pod("a"), pod("b"), pod("c")
    metrics.show_slot_contexts([status(a, 8192), status(b, 4096), PodStatus(c, None)])
    assert registry.get_sample_value(name, {"pod": "http://a", "model": "m"}) == 8192
    assert registry.get_sample_value(name, {"pod": "http://b", "model": "m"}) == 4096
    assert registry.get_sample_value(name, {"pod": "http://c", "model": "m"}) is None  # not read yet
    metrics.show_slot_contexts([status(a, 2048)])  # b left; a restarted with a smaller context
    assert registry.get_sample_value(name, {"pod": "http://a", "model": "m"}) == 2048
    assert registry.get_sample_value(name, {"pod": "http://b", "model": "m"}) is None

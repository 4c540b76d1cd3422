"""A head longer than the pods' slot context, on a real llama-server: never built, and said so.

Issue 23: slots capped at a model's training context made first sight's prefill fail inside
llama-server, and the request fell into a silent `compute/cold`. Here 2 slots of 512 tokens and a
~1.5K-token head: the client gets llama-server's own 400, the gateway counts the head as too long and
names the branch, tries no first-sight build (no prefill, no save), and shows the slot context.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_testbed.workload import WorkloadSpec, make_profile, user_question
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import chat, gateway
from tests.integration.snapshot_bed import TOKEN, agent_pod, metric

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SLOT_CONTEXT = 512


@pytest.fixture
async def http() -> Any:
    async with httpx.AsyncClient(timeout=300) as client:
        yield client


async def test_a_head_longer_than_the_slot_context_is_refused_by_the_pod_and_never_built(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    name = "tiny-dense"
    async with agent_pod(start_llama_server, tiny_models.dense, name, tmp_path / "a", http, slots=2,
                         ctx=2 * SLOT_CONTEXT) as pod:
        profile = make_profile(WorkloadSpec(prefix_chars=6000, day=dt.date(2026, 11, 2), seed=7,
                                            workspace="/home/dev/long"))
        async with gateway([pod.spec], redis_url, prefix="hc", agent_token=TOKEN) as gw:
            answer = await chat(http, gw.url, profile.request(name, user_question(random.Random(3)),
                                                              max_tokens=4))
            too_long = await metric(http, gw.url, "llamafleet_router_head_too_long_total", model=name)
            builds = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_seconds_count")
            prefills = await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                    op="prefill", kind="llama")
            leaders = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                   role="leader")
            context = await metric(http, gw.url, "llamafleet_router_pod_slot_context_tokens",
                                   pod=pod.server.url, model=name)
            decisions = await metric(http, gw.url, "llamafleet_router_decisions_total", action="compute",
                                     branch="cold")
        assert answer.status == 400, answer
        assert answer.action == "compute/head_exceeds_context", answer.action
        assert b"exceeds the available context size" in answer.raw, answer.raw[:300]
        assert too_long == 1
        assert builds == 0 and prefills == 0, (builds, prefills)  # not attempted, so nothing failed
        assert leaders == 1 and pod.files() == []  # it led the head's flight, and saved nothing
        assert context == SLOT_CONTEXT
        assert decisions == 1  # the scheduler's choice, before the flow named the skip

"""First sight through the real gateway over fake pods: a long agent head is built once, in stages, and
the next sessions reuse it without computing it again (a slot the priming loaded, or a restore)."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.integration.gateway_bed import chat
from tests.integration.snapshot_bed import metric
from tests.router.orchestration.bed import assert_idle, fake_pods, gateway_over

pytestmark = [pytest.mark.redis]

DAY = dt.date(2026, 11, 2)
MODEL = "tiny"


async def test_first_session_builds_the_head_in_stages_and_the_next_reuses_it(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    profile = hermes_profile(WorkloadSpec(day=DAY), model=MODEL)
    async with fake_pods(1) as pods, gateway_over(pods, redis_url, prefix="orch-fs") as gw:
        pod = pods[0]
        first = await chat(http, gw.url, profile.request(MODEL, "Please list the files here.", max_tokens=8))
        assert first.status == 200, first.raw[:300]
        assert first.action == "compute/first_sight", first.action
        # The build: one tokenize of the head, its stages and the head saved through the agent.
        assert len(pod.llama.calls_to("/tokenize")) == 1
        stages, heads = pod.agent.saved("st-"), pod.agent.saved("fs-")
        assert len(heads) == 1 and stages, pod.agent.saved()
        assert await metric(http, gw.url, "llamafleet_router_snapshot_saves_total", kind="fs") == 1
        # The request was forwarded into the slot that holds the head: only its tail was computed.
        head = len(pod.llama.calls_to("/completion")[-1].body["prompt"])
        assert first.cache_n >= head - 1 and first.prompt_n < 40, (first.cache_n, first.prompt_n, head)
        # The priming loads the head into idle slots of the pod (2 by default) through the agent, or
        # leaves one that holds it already (the build's own slot, idle again once the answer ended).
        await assert_idle(gw, pods)  # (the priming is work off the request path: it ended too)
        primes = "llamafleet_router_snapshot_primes_total"
        loaded = await metric(http, gw.url, primes, result="loaded")
        held = await metric(http, gw.url, primes, result="held")
        assert loaded >= 1 and loaded + held == 2, (loaded, held)
        assert pod.agent.restores() == heads * int(loaded), pod.agent.restores()

        # (not streamed: the proxy's buffered aiohttp leg)
        body = profile.request(MODEL, "Please run the tests.", max_tokens=8, stream=False)
        second = await chat(http, gw.url, body)
        assert second.status == 200, second.raw[:300]
        assert second.action == "direct/slot_hit" or (
            second.action.startswith("restore/") and second.snapshot in heads), second.action
        assert second.cache_n >= head - 1 and second.prompt_n < 40, (second.cache_n, second.prompt_n)
        # Nothing was built again.
        assert len(pod.llama.calls_to("/tokenize")) == 1 and pod.agent.saved("fs-") == heads
        await assert_idle(gw, pods)

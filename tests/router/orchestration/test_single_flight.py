"""Single flight through the real gateway over fake pods: two sessions of one new head at once, the
first builds it and the second waits for its snapshot instead of computing the head a second time.

The order is made by the fake agent: the build's first save is held until the second session is seen
waiting (the `waiter` count), as tests/integration/test_snapshots_real.py's SaveGate does."""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx
import pytest

from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.integration.gateway_bed import chat
from tests.integration.snapshot_bed import metric, metric_reaches
from tests.router.orchestration.bed import assert_idle, fake_pods, gateway_over

pytestmark = [pytest.mark.redis]

MODEL = "tiny"
FIRST_SIGHT = "llamafleet_router_snapshot_first_sight_total"


async def test_a_second_session_of_a_head_being_built_waits_for_its_snapshot(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    profile = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2)), model=MODEL)
    async with fake_pods(1) as pods, gateway_over(pods, redis_url, prefix="orch-sf") as gw:
        pod = pods[0]
        pod.agent.hold_saves()
        try:
            first = asyncio.create_task(chat(http, gw.url, profile.request(MODEL, "Please list the files.")))
            await pod.agent.save_held()  # the build prefilled its first stage and saves it
            second = asyncio.create_task(chat(http, gw.url, profile.request(MODEL, "Please run the tests.")))
            assert await metric_reaches(http, gw.url, FIRST_SIGHT, 1, timeout=30.0, role="waiter") == 1
        finally:
            pod.agent.release_saves()
        one, two = await asyncio.gather(first, second)
        assert one.status == two.status == 200, (one.raw[:200], two.raw[:200])

        heads = pod.agent.saved("fs-")
        assert len(heads) == 1, pod.agent.saved()
        assert one.action == "compute/first_sight", one.action
        # The waiter restored the leader's snapshot into its own slot and computed only its question.
        assert two.action.startswith("restore/") and two.snapshot == heads[0], (two.action, two.snapshot)
        assert two.slot != one.slot and two.prompt_n < 40, (two.slot, one.slot, two.cache_n, two.prompt_n)
        assert heads[0] in pod.agent.restores()
        # One build: one tokenize of the head, one leader, one waiter.
        assert len(pod.llama.calls_to("/tokenize")) == 1
        assert await metric(http, gw.url, FIRST_SIGHT, role="leader") == 1
        assert await metric(http, gw.url, FIRST_SIGHT, role="waiter") == 1
        await assert_idle(gw, pods)

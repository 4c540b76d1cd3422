"""The gateway on an index behind Redis Sentinel, through a failover under load (issue 25): real
llama-servers, a real master, replica and three Sentinels (tests/fixtures/redis_ha.py)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from llamafleet_testbed.workload import WorkloadSpec, make_profile, user_question
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.fixtures.redis_ha import SentinelDeployment
from tests.integration.gateway_bed import Answer, chat, gateway, settled

pytestmark = [pytest.mark.llama, pytest.mark.redis]

MODEL = "tiny-dense"
SESSIONS = 3
FAILOVER_LIMIT_S = 30.0


async def _health(http: httpx.AsyncClient, url: str) -> str:
    return str((await http.get(url + "/health")).json()["index"])


async def test_a_sentinel_failover_mid_workload_fails_no_request(
        tiny_models: TinyModels, start_llama_server: StartLlamaServer,
        sentinel_deployment: SentinelDeployment) -> None:
    """Three sessions keep sending while the master is killed: every request answers 200; the gateway
    routes degraded while the Sentinels fail over and by the index again once the replica is promoted;
    the index after holds the slots the requests since then were recorded in."""
    pods = [start_llama_server(tiny_models.dense, slots=4, extra_args=("-a", MODEL)) for _ in range(2)]
    profile = make_profile(WorkloadSpec(prefix_chars=6_000))
    rng = random.Random(25)
    answers: list[Answer] = []
    async with gateway([p.url for p in pods], sentinel_deployment.url, prefix="ha") as gw, \
            httpx.AsyncClient(timeout=300) as http:
        stop = asyncio.Event()
        sent = asyncio.Condition()

        async def session() -> None:
            while not stop.is_set():
                answer = await chat(http, gw.url, profile.request(MODEL, user_question(rng), max_tokens=4))
                async with sent:
                    answers.append(answer)
                    sent.notify_all()

        async def answered(count: int) -> None:
            async with sent:
                await sent.wait_for(lambda: len(answers) >= count)

        running = [asyncio.create_task(session()) for _ in range(SESSIONS)]
        try:
            await asyncio.wait_for(answered(SESSIONS), 120)
            assert await _health(http, gw.url) == "ok"
            sentinel_deployment.master.stop()
            async with asyncio.timeout(FAILOVER_LIMIT_S):
                while await _health(http, gw.url) != "degraded":
                    await answered(len(answers) + 1)  # the index's failures show on the requests' path
                while await _health(http, gw.url) != "ok":  # the index's pings find the new master
                    await answered(len(answers) + 1)
            recovered_at = len(answers)
            await asyncio.wait_for(answered(recovered_at + 2 * SESSIONS), 120)
        finally:
            stop.set()
            await asyncio.gather(*running)
        await settled(gw)
        assert sentinel_deployment.master_port() == sentinel_deployment.replica.port
        assert [a.status for a in answers] == [200] * len(answers)
        after = answers[recovered_at + SESSIONS:]  # sent after the index answered again
        assert after and not [a.action for a in after if "degraded" in a.action]
        last = profile.request(MODEL, "what now?", max_tokens=4)
        found = await chat(http, gw.url, last)
        assert found.status == 200 and found.action.endswith("/slot_hit") and found.cache_n > 0

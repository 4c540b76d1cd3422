"""The gateway on a highly available index, through a failover under load (issue 25): real llama-servers,
and either a real master, replica and three Sentinels (tests/fixtures/redis_ha.py) or a real Redis Cluster
of three masters with a replica each (tests/fixtures/redis_cluster.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest

from llamafleet_testbed.workload import WorkloadSpec, make_profile, user_question
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.fixtures.redis_cluster import RedisCluster
from tests.fixtures.redis_ha import SentinelDeployment
from tests.integration.gateway_bed import Answer, chat, gateway, settled

pytestmark = [pytest.mark.llama, pytest.mark.redis]

MODEL = "tiny-dense"
PREFIX = "ha"
SESSIONS = 3
FAILOVER_LIMIT_S = 30.0


async def _health(http: httpx.AsyncClient, url: str) -> str:
    return str((await http.get(url + "/health")).json()["index"])


@dataclass
class Failover:
    """An HA index deployment: its URL, how to kill the master serving the model's keys, and whether
    the replica took over."""

    url: str
    kill_master: Callable[[], None]
    promoted: Callable[[], bool]


def _sentinel(deployment: SentinelDeployment) -> Failover:
    return Failover(deployment.url, deployment.master.stop,
                    lambda: deployment.master_port() == deployment.replica.port)


def _cluster(cluster: RedisCluster) -> Failover:
    base = f"{PREFIX}:{{{MODEL}}}:"  # the model's keys, all in the hash slot of this one (redis_index)
    master = cluster.master_of(base)
    return Failover(cluster.url, master.stop, lambda: cluster.master_of(base) is not master)


@pytest.fixture(params=["sentinel", "cluster"])
def failover(request: pytest.FixtureRequest) -> Failover:
    if request.param == "sentinel":
        return _sentinel(request.getfixturevalue("sentinel_deployment"))
    return _cluster(request.getfixturevalue("fresh_redis_cluster"))


async def test_a_failover_mid_workload_fails_no_request(
        tiny_models: TinyModels, start_llama_server: StartLlamaServer, failover: Failover) -> None:
    """Three sessions keep sending while the master (the Cluster: the model's shard's master) is killed:
    every request answers 200; the gateway routes degraded while the failover lasts and by the index
    again once the replica is promoted; the index after holds the slots the requests since then were
    recorded in."""
    pods = [start_llama_server(tiny_models.dense, slots=4, extra_args=("-a", MODEL)) for _ in range(2)]
    profile = make_profile(WorkloadSpec(prefix_chars=6_000))
    rng = random.Random(25)
    answers: list[Answer] = []
    async with gateway([p.url for p in pods], failover.url, prefix=PREFIX) as gw, \
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
            failover.kill_master()
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
        assert failover.promoted()
        assert [a.status for a in answers] == [200] * len(answers)
        after = answers[recovered_at + SESSIONS:]  # sent after the index answered again
        assert after and not [a.action for a in after if "degraded" in a.action]
        last = profile.request(MODEL, "what now?", max_tokens=4)
        found = await chat(http, gw.url, last)
        assert found.status == 200 and found.action.endswith("/slot_hit") and found.cache_n > 0

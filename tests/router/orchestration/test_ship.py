"""The background ship through the real gateway over fake pods: a session that restores a stage on its
pod and computes the head's rest has the gateway copy the whole head there from its peer afterwards,
and the next session on that pod restores the head locally (snapshots/ship.py)."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from llamafleet_core.types import SlotRef
from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.integration.gateway_bed import Answer, Gateway, chat
from tests.integration.snapshot_bed import metric, metric_reaches
from tests.router.orchestration.agents import Stored
from tests.router.orchestration.bed import Pod, assert_idle, fake_pods, gateway_over

pytestmark = [pytest.mark.redis]

MODEL = "tiny"
PROFILE = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2), workspace="/home/dev/ship"), model=MODEL)
PREFIX = "orch-sh"


async def ask(http: httpx.AsyncClient, gw: Gateway, question: str) -> Answer:
    answer = await chat(http, gw.url, PROFILE.request(MODEL, question, max_tokens=8))
    assert answer.status == 200, answer.raw[:300]
    return answer


def pulls(pod: Pod) -> list[tuple[str, str]]:
    """(snapshot, source agent) of every pull the pod's agent was asked for."""
    return [(c.body["name"], c.body["source"].rstrip("/")) for c in pod.agent.calls
            if c.path == "/v1/snapshots/pull"]


async def lease_all(gw: Gateway, pod: Pod) -> list[SlotRef]:
    """Every slot of `pod` leased by another gateway replica (in the shared Redis)."""
    held = [SlotRef(pod.url, s) for s in range(pod.llama.n_slots)]
    for ref in held:
        assert await gw.leases.acquire(ref, "another-replica", ttl_s=60.0)
    return held


async def test_a_snapshot_a_pod_wanted_is_copied_there_for_its_next_session(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(2) as pods:
        a, b = pods
        # Pod a builds the head alone (the gateway sees only a).
        async with gateway_over([a], redis_url, prefix=PREFIX, prime_slots=0) as gw:
            first = await ask(http, gw, "Please list the files here.")
            assert first.action == "compute/first_sight", first.action
            await assert_idle(gw, [a])
        [head] = a.agent.saved("fs-")
        stage = max(a.agent.saved("st-"), key=lambda n: a.agent.snapshots[n].manifest.n_chars)
        assert a.agent.snapshots[stage].manifest.n_chars < a.agent.snapshots[head].manifest.n_chars
        # Pod b holds only that stage, as if it had built it before.
        kept = a.agent.snapshots[stage]
        b.agent.snapshots[stage] = Stored(kept.manifest, list(kept.pieces))

        async with gateway_over(pods, redis_url, prefix=PREFIX, prime_slots=0) as gw:
            held = await lease_all(gw, a)
            second = await ask(http, gw, "Please run the tests.")
            assert second.pod == b.url, second.pod
            # b restored its own stage and computed the head's rest rather than pull the head now.
            assert second.action == "restore/restore" and second.snapshot == stage, (
                second.action, second.snapshot)
            # Then the gateway copied the head to b in the background, from a.
            ships = await metric_reaches(http, gw.url, "llamafleet_router_snapshot_ships_total", 1,
                                         timeout=30.0, result="ok")
            assert ships == 1, ships
            assert pulls(b) == [(head, a.agent_url)], pulls(b)
            assert head in b.agent.snapshots

            # The next session on b, in another slot (the second's holds its conversation): the head is
            # restored there from b's own copy, no pull on its path.
            assert await gw.leases.acquire(SlotRef(b.url, second.slot), "another-replica", ttl_s=60.0)
            third = await ask(http, gw, "Please check the build.")
            assert third.pod == b.url and third.slot != second.slot, (third.pod, third.slot)
            assert third.action.startswith("restore/") and third.snapshot == head, (
                third.action, third.snapshot)
            assert b.agent.restores()[-1] == head and pulls(b) == [(head, a.agent_url)], pulls(b)
            assert await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                                source="peer", result="ok") == 0
            assert third.prompt_n < second.prompt_n, (second.prompt_n, third.prompt_n)
            for ref in [*held, SlotRef(b.url, second.slot)]:
                await gw.leases.release(ref, "another-replica")
            await assert_idle(gw, pods)

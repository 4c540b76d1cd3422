"""Restore-on-miss through the real gateway over fake pods: a head whose slot was taken since is restored
from its snapshot (on its pod, or pulled from a peer), and a refused restore still answers."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from llamafleet_core.types import SlotRef
from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.integration.gateway_bed import Answer, Gateway, chat
from tests.integration.snapshot_bed import metric
from tests.router.orchestration.bed import Pod, assert_idle, fake_pods, gateway_over

pytestmark = [pytest.mark.redis]

MODEL = "tiny"
HOME = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2)), model=MODEL)
# Another workspace: the same tools and most of the system prompt, another cwd line near its end.
OTHER = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2), workspace="/home/dev/other"), model=MODEL)


async def ask(http: httpx.AsyncClient, gw: Gateway, question: str, *, other: bool = False) -> Answer:
    profile = OTHER if other else HOME
    answer = await chat(http, gw.url, profile.request(MODEL, question, max_tokens=8))
    assert answer.status == 200, answer.raw[:300]
    return answer


async def evict_home(http: httpx.AsyncClient, gw: Gateway, pod: Pod) -> None:
    """HOME's head built into the pod's only slot, then OTHER's over it."""
    first = await ask(http, gw, "Please list the files here.")
    assert first.action == "compute/first_sight", first.action
    other = await ask(http, gw, "Please read the README.", other=True)
    # The other workspace's build starts from the stage it shares with HOME's head.
    # Its build starts from what the slot holds of HOME's head (the same tools, most of the prompt).
    assert other.action == "compute/first_sight", other.action
    assert other.cache_n > 0.9 * first.cache_n, (other.cache_n, first.cache_n)
    assert len(pod.agent.saved("fs-")) == 2
    await assert_idle(gw, [pod])


async def test_a_head_evicted_from_its_slot_is_restored_from_its_snapshot(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(1, slots=1) as pods, gateway_over(pods, redis_url, prefix="orch-rs") as gw:
        pod = pods[0]
        await evict_home(http, gw, pod)
        home_fs = pod.agent.saved("fs-")[0]
        builds = len(pod.llama.calls_to("/tokenize"))

        again = await ask(http, gw, "Please run the tests.")
        assert again.action.startswith("restore/"), again.action
        assert again.snapshot == home_fs, again.snapshot
        assert pod.agent.restores()[-1] == home_fs
        assert again.prompt_n < 40, (again.cache_n, again.prompt_n)  # only the question was computed
        assert len(pod.llama.calls_to("/tokenize")) == builds  # nothing built again
        assert await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                            source="local", result="ok") == 1
        await assert_idle(gw, pods)


async def test_a_refused_restore_is_counted_and_the_request_computes(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(1, slots=1) as pods, gateway_over(pods, redis_url, prefix="orch-rf") as gw:
        pod = pods[0]
        await evict_home(http, gw, pod)
        home_fs = pod.agent.saved("fs-")[0]
        pod.agent.refuse_restores = True

        again = await ask(http, gw, "Please run the tests.")
        assert pod.agent.restores() == [home_fs]  # it was tried
        # Computed instead: HOME's head built again over what the slot holds (OTHER's head shares most
        # of it), and saved again under the same name.
        assert again.action == "compute/first_sight", again.action
        assert pod.agent.saved("fs-").count(home_fs) == 2, pod.agent.saved("fs-")
        assert await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                            op="restore", kind="llama") == 1
        assert await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                            source="local", result="failed") == 1
        await assert_idle(gw, pods)


async def test_a_head_on_a_busy_pod_is_pulled_to_the_other_and_restored_there(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(2) as pods, gateway_over(pods, redis_url, prefix="orch-pl", prime_slots=0) as gw:
        first = await ask(http, gw, "Please list the files here.")
        assert first.action == "compute/first_sight", first.action
        await assert_idle(gw, pods)
        builder = next(p for p in pods if p.url == first.pod)
        other = next(p for p in pods if p is not builder)
        # Another gateway replica holds every slot of the builder (its leases in the shared Redis).
        held = [SlotRef(builder.url, s) for s in range(builder.llama.n_slots)]
        for ref in held:
            assert await gw.leases.acquire(ref, "another-replica", ttl_s=60.0)

        second = await ask(http, gw, "Please run the tests.")
        assert second.pod == other.url, second.pod
        assert second.action.startswith("restore/") and second.snapshot.startswith("fs-"), second.action
        assert [c.body["name"] for c in other.agent.calls if c.path == "/v1/snapshots/pull"] == [
            second.snapshot]
        assert second.prompt_n < 40, (second.cache_n, second.prompt_n)
        assert await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                            source="peer", result="ok") == 1
        for ref in held:
            await gw.leases.release(ref, "another-replica")
        await assert_idle(gw, pods)

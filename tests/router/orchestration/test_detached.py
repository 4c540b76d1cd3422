"""The detached first sight through the real gateway over fake pods: a later day's session resumes from
the stage before its date line and is forwarded at once, while its head is built from that stage in a
slot the gateway lends, after it answers (snapshots/detached.py, request/lender.py)."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from llamafleet_core.types import SlotRef
from llamafleet_router.snapshots.detached import DETACH_MAX_TAIL_CHARS
from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.integration.gateway_bed import Answer, Gateway, chat
from tests.integration.snapshot_bed import metric, metric_reaches
from tests.router.orchestration.bed import assert_idle, fake_pods, gateway_over

pytestmark = [pytest.mark.redis]

MODEL = "tiny"
DAY = dt.date(2026, 11, 2)
DAY1 = hermes_profile(WorkloadSpec(day=DAY), model=MODEL)
DAY2 = hermes_profile(WorkloadSpec(day=DAY + dt.timedelta(days=1)), model=MODEL)


async def ask(http: httpx.AsyncClient, gw: Gateway, body: dict[str, object]) -> Answer:
    answer = await chat(http, gw.url, body)
    assert answer.status == 200, answer.raw[:300]
    return answer


async def test_a_later_days_head_is_built_in_a_lent_slot_after_its_session_answers(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(1) as pods:
        pod = pods[0]
        async with gateway_over(pods, redis_url, prefix="orch-dt1") as gw:
            first = await ask(http, gw, DAY1.request(MODEL, "Please list the files here.", max_tokens=8))
            assert first.action == "compute/first_sight", first.action
            await assert_idle(gw, pods)
        [day1_head] = pod.agent.saved("fs-")
        # The pod restarts (its slots empty, its agent keeps the files) and the gateway starts over with
        # an empty index: it lists the agent's snapshots again.
        pod.llama.slots = [[] for _ in range(pod.llama.n_slots)]
        async with gateway_over(pods, redis_url, prefix="orch-dt2") as gw:
            chats = len(pod.llama.calls)
            later = await ask(http, gw, DAY2.request(MODEL, "Please run the tests.", max_tokens=8))
            # It restored the stage before its date line and was forwarded at once, its head not built.
            assert later.action == "restore/restore_first_sight_detached", later.action
            assert later.snapshot.startswith("st-"), later.snapshot
            # The head is built in another slot, from the same stage, once the request answers.
            assert await metric_reaches(http, gw.url, "llamafleet_router_snapshot_saves_total", 1,
                                        timeout=30.0, kind="fs") == 1
            [head] = [n for n in pod.agent.saved("fs-") if n != day1_head]
            snaps = pod.agent.snapshots
            tail = snaps[head].manifest.n_chars - snaps[later.snapshot].manifest.n_chars
            assert 0 < tail < DETACH_MAX_TAIL_CHARS, tail  # (a short tail: the date line's)
            [lent] = [c.body["slot"] for c in pod.agent.calls
                      if c.path == "/v1/snapshots/save" and c.body["name"] == head]
            assert lent != later.slot, (lent, later.slot)
            assert pod.agent.restores()[-2:] == [later.snapshot, later.snapshot]  # the request's, the build's
            # The build's tokenize came after the request reached the pod (what its wait for the answer
            # guarantees; the order alone does not show that it waited).
            after = [c.path for c in pod.llama.calls[chats:]]
            assert after.index("/v1/chat/completions") < after.index("/tokenize"), after
            await assert_idle(gw, pods)  # the lent slot was given back (no claim, no lease)

            # The next session (the two slots holding the day's head busy with other sessions) restores
            # the head just built, on its pod.
            busy = [SlotRef(pod.url, s) for s in (later.slot, lent)]
            for ref in busy:
                assert await gw.leases.acquire(ref, "another-replica", ttl_s=60.0)
            nxt = await ask(http, gw, DAY2.request(MODEL, "Please check the build.", max_tokens=8))
            assert nxt.action.startswith("restore/") and nxt.snapshot == head, (nxt.action, nxt.snapshot)
            assert nxt.prompt_n < 40, (nxt.cache_n, nxt.prompt_n)
            assert await metric(http, gw.url, "llamafleet_router_snapshot_saves_total", kind="fs") == 1
            for ref in busy:
                await gw.leases.release(ref, "another-replica")
            await assert_idle(gw, pods)

"""Snapshots through the real gateway: real llama-server pods, real agents, real Redis.

What these tests hold the gateway to (issue 4, items 2, 3, 4 and 6), for an attention-only and a hybrid
model alike:
- the 2nd and 3rd of three concurrent agent sessions reuse >= 95% of the first's ~14K-token prefix,
  on one pod and across two pods (first sight with single flight, restore-on-miss, pulls);
- after the pods restart, a next-day session resumes from the stage snapshot before the date line;
- a bad snapshot (corrupt, truncated, other model, other KV setting, peer dying mid-transfer, wrong
  token, traversal name) is never restored, and the client still gets the right answer;
- greedy answers after a restore equal a cold run's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_core.types import SlotRef
from llamafleet_testbed.workload import AgentProfile, WorkloadSpec, make_profile, user_question
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import Answer, Gateway, chat, gateway, settled
from tests.integration.snapshot_bed import (
    TOKEN,
    AgentPod,
    SaveGate,
    agent_pod,
    damage,
    metric,
    metric_reaches,
)

pytestmark = [pytest.mark.llama, pytest.mark.redis]

BIG = 62_000  # about 14K tokens, as a real agent client sends
SMALL = 12_000  # about 3K tokens: enough for the fault and correctness cases, 5x faster
DAY = dt.date(2026, 11, 2)


@pytest.fixture(params=["dense", "hybrid"])
def model(request: pytest.FixtureRequest, tiny_models: TinyModels) -> tuple[str, Path]:
    return f"tiny-{request.param}", getattr(tiny_models, request.param)


@pytest.fixture
async def http() -> Any:
    async with httpx.AsyncClient(timeout=300) as client:
        yield client


async def _stream_until_first_byte(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                                   started: asyncio.Event) -> Answer:
    """Stream one chat request; set `started` at its first byte (the session is generating)."""
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        raw = b""
        async for chunk in resp.aiter_raw():
            started.set()
            raw += chunk
    started.set()
    timings: dict[str, Any] = {}
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            timings = json.loads(line[6:]).get("timings", timings)
    h = resp.headers
    return Answer(resp.status_code, h.get("x-llamafleet-pod", ""), int(h.get("x-llamafleet-slot", "-1")),
                  h.get("x-llamafleet-action", ""), int(timings.get("cache_n", 0)),
                  int(timings.get("prompt_n", 0)), raw, h.get("x-llamafleet-snapshot", ""))


async def _three_sessions(http: httpx.AsyncClient, url: str, profile: AgentProfile, name: str,
                          rng: random.Random, *, during_build: SaveGate | None = None) -> list[Answer]:
    """Session 1 streams; 2 and 3 start once it generates, or (`during_build`: the pods' save gate)
    while its first-sight build is held at its first save, which goes on once both wait for it."""
    started = asyncio.Event()
    if during_build is not None:
        during_build.close()
    try:
        first = asyncio.create_task(_stream_until_first_byte(
            http, url, profile.request(name, user_question(rng), max_tokens=48), started))
        if during_build is not None:
            await during_build.holding()
        else:
            await asyncio.wait_for(started.wait(), 120)
        later = [asyncio.create_task(chat(http, url, profile.request(name, user_question(rng), max_tokens=8)))
                 for _ in range(2)]
        if during_build is not None:
            await metric_reaches(http, url, "llamafleet_router_snapshot_first_sight_total", 2, role="waiter")
    finally:
        if during_build is not None:
            during_build.open()
    answers = await asyncio.gather(first, *later)
    return list(answers)


def _prefix_tokens(first: Answer) -> int:
    return first.prompt_tokens - 40  # the question and the generation prompt are under 40 tokens


async def test_concurrent_sessions_reuse_the_prefix_when_on_one_pod_and_on_two_pods(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """The first session of a never-seen prefix snapshots it; the 2nd and 3rd reuse >= 95% of it, when
    they start while the first generates (one pod) and while it still builds it (two pods: they wait
    for its snapshot, and a session that lands on the other pod pulls it first)."""
    name, path = model
    rng = random.Random(5)
    saves = SaveGate()
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, saves=saves) as a, \
            agent_pod(start_llama_server, path, name, tmp_path / "b", http, saves=saves) as b:
        profile = make_profile(WorkloadSpec(prefix_chars=BIG, day=DAY))
        async with gateway([a.spec], redis_url, prefix=f"s1{name}", agent_token=TOKEN) as gw:
            one = await _three_sessions(http, gw.url, profile, name, rng)
        assert all(x.status == 200 for x in one), one
        assert one[0].action == "compute/first_sight", one[0].action
        for x in one[1:]:
            assert x.cache_n >= 0.95 * _prefix_tokens(one[0]), (x.action, x.cache_n, one[0].prompt_tokens)
            # The first-sight snapshot restored, or found in the slot it was primed into (dense: a hit).
            restored = x.action.startswith("restore/") and x.snapshot.startswith("fs-")
            assert restored or x.action == "direct/slot_hit", (x.action, x.snapshot)

        # Another agent (other tools and rules): nothing of the first part's stages helps it.
        other = make_profile(WorkloadSpec(prefix_chars=BIG, day=DAY, seed=77, workspace="/home/dev/other"))
        async with gateway([a.spec, b.spec], redis_url, prefix=f"s2{name}", agent_token=TOKEN) as gw:
            two = await _three_sessions(http, gw.url, other, name, rng, during_build=saves)
            waiters = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                   role="waiter")
            leaders = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                   role="leader")
            pulled = await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                                  source="peer", result="ok")
        assert all(x.status == 200 for x in two), two
        for x in two[1:]:
            assert x.cache_n >= 0.95 * _prefix_tokens(two[0]), (x.action, x.cache_n, two[0].prompt_tokens)
        layout = [(x.action, x.pod, x.slot, x.snapshot, x.cache_n) for x in two]
        # Single flight: exactly one of the three sessions computes the prefix; the two that started
        # while it was being built waited for its snapshot.
        assert leaders == 1 and [x.action.startswith("compute/") for x in two].count(True) == 1, layout
        assert waiters == 2, ("both later sessions started while the prefix was being built", layout)
        # Where sessions 2 and 3 land is the scheduler's choice; a session on a pod other than the
        # leader's can only reuse the prefix by pulling it.
        on_b = [x for x in two if x.pod == b.server.url]
        assert not on_b or pulled >= 1, ([x.pod for x in two], pulled)
        assert all(x.action.startswith("restore/") for x in two[1:] if x.pod == b.server.url), two


async def _primes_settled(http: httpx.AsyncClient, url: str, results: int) -> dict[str, float]:
    """The gateway's prime results once there are `results` of them (loaded, held, no_slot, failed)."""
    name = "llamafleet_router_snapshot_primes_total"
    kinds = ("loaded", "held", "no_slot", "failed")
    for _ in range(300):
        counts = {r: await metric(http, url, name, result=r) for r in kinds}
        if sum(counts.values()) >= results:
            return counts
        await asyncio.sleep(0.05)
    raise AssertionError(f"priming did not finish: {counts}")


async def test_a_new_prefix_is_primed_into_idle_slots_of_its_pod_so_the_next_session_restores_nothing(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """Right after the first session of a new prefix saved it, idle slots of the pod that saved it (2 by
    default) are loaded with it in the background, one at a time, and no other pod's. Sessions that
    start while the first still generates and land on a primed slot restore nothing on their request
    path (a slot hit, or a restore the flow skips because the slot holds exactly that snapshot), and
    reuse the prefix."""
    name, path = model
    rng = random.Random(17)
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, slots=3) as a, \
            agent_pod(start_llama_server, path, name, tmp_path / "b", http, slots=3) as b:
        profile = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, seed=41, workspace="/home/dev/pr"))
        async with gateway([a.spec, b.spec], redis_url, prefix=f"pr{name}", agent_token=TOKEN) as gw:
            started = asyncio.Event()
            body = profile.request(name, user_question(rng), max_tokens=256) | {"ignore_eos": True}
            first = asyncio.create_task(_stream_until_first_byte(http, gw.url, body, started))
            await asyncio.wait_for(started.wait(), 120)
            primes = await _primes_settled(http, gw.url, results=2)
            primed = gw.app.state.gateway.snapshots.primer.slots.slots()
            restores = [await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                                     source=s, result="ok") for s in ("local", "peer")]
            later = await asyncio.gather(*(chat(http, gw.url, profile.request(
                name, user_question(rng), max_tokens=8)) for _ in range(2)))
            used = await metric(http, gw.url, "llamafleet_router_snapshot_primes_total", result="used")
            after = [await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                                  source=s, result="ok") for s in ("local", "peer")]
            uids = {p.endpoint.url: p.endpoint.uid for p in await gw.app.state.gateway.discovery.endpoints()}
            one = await first
        assert one.status == 200 and one.action == "compute/first_sight", one
        assert primes["loaded"] == 2, primes
        assert [ref.pod_uid for ref in primed] == [uids[one.pod]] * 2, (primed, uids, one.pod)
        assert restores == [2.0, 0.0], restores  # the priming's own restores, local: no pull
        layout = [(x.action, x.pod, x.slot, x.cache_n) for x in later]
        on_primed = [x for x in later if SlotRef(uids[x.pod], x.slot) in primed]
        assert len(on_primed) >= 1, (layout, primed)
        for x in later:
            assert x.status == 200 and x.cache_n >= 0.95 * _prefix_tokens(one), layout
        # The primed slot's session skipped its restore; the other restored once, unless it came after the
        # first session ended and found that session's slot holding the prefix (a slot hit: no restore).
        others = [x for x in later if x not in on_primed]
        restored = [x for x in others if x.action.startswith("restore/")]
        assert all(x.action.startswith(("restore/", "direct/slot_hit")) for x in others), layout
        assert sum(after) - sum(restores) == len(restored), (layout, restores, after)
        if name == "tiny-hybrid":
            assert used == len(on_primed) and all(x.action == "restore/primed" for x in on_primed), layout
        else:
            assert all(x.action == "direct/slot_hit" for x in on_primed), layout


async def test_a_pod_is_never_primed_into_its_last_idle_slot(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """Two slots, one busy with the first session: the other stays free for the next request."""
    name, path = "tiny-dense", tiny_models.dense
    rng = random.Random(29)
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, slots=2) as a:
        profile = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, seed=47, workspace="/home/dev/ls"))
        async with gateway([a.spec], redis_url, prefix=f"pl{name}", agent_token=TOKEN) as gw:
            started = asyncio.Event()
            body = profile.request(name, user_question(rng), max_tokens=256) | {"ignore_eos": True}
            first = asyncio.create_task(_stream_until_first_byte(http, gw.url, body, started))
            await asyncio.wait_for(started.wait(), 120)
            primes = await _primes_settled(http, gw.url, results=1)
            await first
        assert primes == {"loaded": 0, "held": 0, "no_slot": 1, "failed": 0}, primes


async def test_a_primed_slot_that_another_replica_used_is_restored_again(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """The hybrid model, where the gateway skips the restore into a primed slot: when a request that
    went straight to llama-server (another replica's, as far as this gateway knows) used the slot, the
    skip would leave the next session to compute the whole prefix; the gateway sees the slot's new task
    in GET /slots and restores."""
    name, path = "tiny-hybrid", tiny_models.hybrid
    rng = random.Random(23)
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, slots=3) as a:
        profile = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, seed=43, workspace="/home/dev/ra"))
        async with gateway([a.spec], redis_url, prefix=f"pu{name}", agent_token=TOKEN) as gw:
            first = await chat(http, gw.url, profile.request(name, user_question(rng), max_tokens=4))
            await _primes_settled(http, gw.url, results=2)
            primed = gw.app.state.gateway.snapshots.primer.slots.slots()
            # Another replica's request in a primed slot (its lease and index record never reach this
            # gateway).
            ref = primed[0]
            other = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, seed=44, workspace="/home/dev/rb"))
            direct = await http.post(a.server.url + "/v1/chat/completions", json={
                **other.request(name, "Hello?", max_tokens=2, stream=False), "id_slot": ref.slot})
            assert direct.status_code == 200, direct.text
            # Every other slot busy, so the next session can only go to that one.
            for slot in range(a.server.slots):
                if SlotRef(a.server.url, slot) != ref:
                    assert await gw.leases.acquire(SlotRef(a.server.url, slot), "another-replica", 120.0)
            second = await chat(http, gw.url, profile.request(name, user_question(rng), max_tokens=4))
            used = await metric(http, gw.url, "llamafleet_router_snapshot_primes_total", result="used")
        assert first.action == "compute/first_sight", first.action
        assert (second.pod, second.slot) == (ref.pod_uid, ref.slot), (second, ref)
        assert used == 0 and second.action.startswith("restore/"), (used, second.action)
        assert second.cache_n >= 0.95 * _prefix_tokens(first), (second.cache_n, first.prompt_tokens)


async def _wait_for_new_epoch(gw_app: Any, url: str, old_epoch: int) -> None:
    discovery = gw_app.state.gateway.discovery
    for _ in range(300):
        for pod in await discovery.endpoints():
            if pod.endpoint.url == url and pod.ready and pod.endpoint.pod.epoch > old_epoch:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not see the pod restart")


async def _wait_until_down(gw_app: Any, url: str) -> None:
    discovery = gw_app.state.gateway.discovery
    for _ in range(300):
        if not any(p.endpoint.url == url and p.ready for p in await discovery.endpoints()):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not see the pod stop")


async def _epoch(gw_app: Any, url: str) -> int:
    pods = await gw_app.state.gateway.discovery.endpoints()
    return int(next(p.endpoint.pod.epoch for p in pods if p.endpoint.url == url))


@pytest.mark.parametrize("slots", [4, 1])
async def test_next_day_session_resumes_before_the_date_line_when_the_pod_restarted(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient, slots: int,
) -> None:
    """Day 1 snapshots the session prefix and a stage at the start of its last line (the date line).
    The pod restarts (its index entries are purged; its agent keeps the files); the gateway records
    the agent's snapshots again as soon as it sees the pod back, before any request, and the first
    day-2 session restores the stage snapshot (for a hybrid, the only one its prompt extends exactly)
    and computes only the date line's tail. The day-2 session
    prefix is built from the same stage in another idle slot after the request answers, or in the
    request's own slot before it is forwarded when the pod has no other slot."""
    name, path = model
    rng = random.Random(9)
    day1 = make_profile(WorkloadSpec(prefix_chars=BIG, day=DAY))
    day2 = make_profile(WorkloadSpec(prefix_chars=BIG, day=DAY + dt.timedelta(days=1)))
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, slots=slots) as a, \
            gateway([a.spec], redis_url, prefix=f"r{name}{slots}", agent_token=TOKEN) as gw:
        started = time.perf_counter()
        first = await chat(http, gw.url, day1.request(name, user_question(rng), max_tokens=4))
        cold_s = time.perf_counter() - started
        assert first.status == 200 and first.action == "compute/first_sight", first.action
        kinds = [p.name[:3] for p in a.files()]
        assert kinds.count("fs-") == 1 and kinds.count("st-") >= 1, a.files()  # a stage at the date line

        epoch = await _epoch(gw.app, a.server.url)
        a.server.stop()
        await _wait_until_down(gw.app, a.server.url)
        await asyncio.to_thread(a.server.start)
        await _wait_for_new_epoch(gw.app, a.server.url, epoch)
        resynced_early = 0.0
        for _ in range(50):  # the gateway lists the restarted pod's snapshots without waiting for a request
            resynced_early = await metric(http, gw.url, "llamafleet_router_snapshot_resynced_total")
            if resynced_early >= 2:
                break
            await asyncio.sleep(0.1)

        started = time.perf_counter()
        later = await chat(http, gw.url, day2.request(name, user_question(rng), max_tokens=4))
        warm_s = time.perf_counter() - started
        resynced = await metric(http, gw.url, "llamafleet_router_snapshot_resynced_total")
        day2_files = a.files("fs-")
        for _ in range(100):  # the background build ends within a prefill of the date line's tail
            if len(day2_files) == 2:
                break
            await asyncio.sleep(0.1)
            day2_files = a.files("fs-")
        nxt = await chat(http, gw.url, day2.request(name, user_question(rng), max_tokens=4))
        # Day 3, two sessions at once: both restore the stage before the date line; one builds the new
        # prefix detached, the other goes on at once instead of waiting for that build.
        together: list[Answer] = []
        waited = 0.0
        if slots > 1:
            day3 = make_profile(WorkloadSpec(prefix_chars=BIG, day=DAY + dt.timedelta(days=2)))
            waiters = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                   role="waiter")
            together = list(await asyncio.gather(*(
                chat(http, gw.url, day3.request(name, user_question(rng), max_tokens=4)) for _ in range(2))))
            waited = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                  role="waiter") - waiters
            for _ in range(100):  # let the detached day-3 build end before the pod stops
                if len(a.files("fs-")) >= 3:
                    break
                await asyncio.sleep(0.1)
    assert later.status == 200
    assert resynced_early >= 2, "the restarted pod's snapshots were recorded again before any request"
    assert resynced >= 2
    branch = "restore_first_sight_detached" if slots > 1 else "restore_first_sight"
    assert later.action == f"restore/{branch}" and later.snapshot.startswith("st-"), \
        (later.action, later.snapshot)
    assert later.cache_n >= 0.95 * _prefix_tokens(first), (later.cache_n, first.prompt_tokens)
    assert warm_s < 0.5 * cold_s, (warm_s, cold_s)
    # The day-2 session prefix was built in another slot while the request was answered, from the
    # same stage: a second `fs-` snapshot, and the next day-2 session restores it.
    assert len(day2_files) == 2, day2_files
    # (An attention-only model may instead resume the first day-2 session's slot: same reuse.)
    assert nxt.action in ("restore/restore", "direct/slot_hit"), (nxt.action, nxt.snapshot)
    assert nxt.prompt_tokens - nxt.cache_n < 40, (nxt.action, nxt.cache_n, nxt.prompt_tokens)
    if slots > 1:
        # One builds the day-3 prefix detached (its slot holds day 2's up to the date line, or it
        # restored the stage); the other goes on as decided instead of waiting for that build.
        actions = [x.action for x in together]
        assert sum(a.endswith("first_sight_detached") for a in actions) == 1, actions
        assert waited == 0 and all(x.status == 200 for x in together), actions
        assert all(x.prompt_tokens - x.cache_n < 60 for x in together), together


async def _computed(http: httpx.AsyncClient, server_url: str) -> int:
    """Prompt tokens the server computed so far (cached ones excluded): its own counter."""
    for line in (await http.get(server_url + "/metrics")).text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("llama-server /metrics has no prompt_tokens_total")


async def test_first_sessions_of_two_workspaces_compute_their_shared_part_once(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """Two workspaces' first sessions start together: their prefixes differ only from the workspace
    block on. The second waits for the first's stage at that block (stage single flight), restores it
    and computes only its own tail, so the server computes the shared part once, not twice."""
    name, path = model
    rng = random.Random(13)
    one = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, workspace="/home/dev/one"))
    two = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, workspace="/home/dev/two"))
    saves = SaveGate()
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, saves=saves) as a, \
            gateway([a.spec], redis_url, prefix=f"w{name}", agent_token=TOKEN) as gw:
        before = await _computed(http, a.server.url)
        # The first's build stops at its first save, every stage's flight open: the second starts
        # while the shared stages are being built, and the build goes on once it waits for them.
        saves.close()
        try:
            first = asyncio.create_task(chat(http, gw.url, one.request(name, user_question(rng),
                                                                       max_tokens=4)))
            await saves.holding()
            second = asyncio.create_task(chat(http, gw.url, two.request(name, user_question(rng),
                                                                        max_tokens=4)))
            await metric_reaches(http, gw.url, "llamafleet_router_snapshot_first_sight_total", 1,
                                 role="stage_waiter")
        finally:
            saves.open()
        answers = [await first, await second]
        await settled(gw)  # a detached build of the second prefix's tail may still run
        stage_waiters = await metric(http, gw.url, "llamafleet_router_snapshot_first_sight_total",
                                     role="stage_waiter")
        computed = await _computed(http, a.server.url) - before
    assert all(x.status == 200 for x in answers), answers
    prefix = _prefix_tokens(answers[0])
    # One prefix, two short tails (the second's maybe twice: request and detached build), 2 questions.
    assert computed < 1.3 * prefix, (computed, prefix, [x.action for x in answers])
    assert stage_waiters == 1, [x.action for x in answers]
    assert answers[1].cache_n >= 0.9 * prefix, (answers[1].action, answers[1].cache_n, prefix)


def _tokens(raw: bytes) -> list[str]:
    return [t["token"] for t in json.loads(raw)["choices"][0]["logprobs"]["content"]]


def _agreement(got: list[str], want: list[str]) -> float:
    if not want:
        return 1.0 if not got else 0.0
    same = sum(1 for a, b in zip(got, want, strict=False) if a == b)
    return same / max(len(got), len(want))


async def _fresh_slots(pod: AgentPod, gw: Gateway, name: str, http: httpx.AsyncClient) -> None:
    """Empty the pod's slots and the index's slot entries: the next request can reuse the prefix only
    through a snapshot."""
    await settled(gw)  # the last response's index writes (and primes) land first
    await pod.erase_slots(http)
    for slot in range(pod.server.slots):
        await gw.index.forget_slot(name, SlotRef(pod.server.url, slot))


async def test_a_snapshot_a_pod_wanted_is_copied_there_for_its_next_session(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """Pod b holds only the last stage of an agent's head, pod a the whole head. A session that must run
    on b (a's slots leased by another replica) restores b's stage and computes the head's last lines
    rather than pull the whole head on its request path; the gateway then copies the head to b in the
    background (snapshots/ship.py), and the next session on b restores it there."""
    from llamafleet_core.agent_client import AgentClient

    name, path = model
    rng = random.Random(9)
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http) as a, \
            agent_pod(start_llama_server, path, name, tmp_path / "b", http) as b:
        profile = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY, seed=31, workspace="/home/dev/ship"))
        prefix = f"sh{name}"
        async with gateway([a.spec], redis_url, prefix=prefix, agent_token=TOKEN) as gw:
            first = await chat(http, gw.url, profile.request(name, user_question(rng), max_tokens=8))
        assert first.status == 200 and first.action == "compute/first_sight", first
        [head] = [p.name.removesuffix(".bin") for p in a.files("fs-")]
        stages = [p.name.removesuffix(".bin") for p in a.files("st-")]
        stage = max(stages, key=lambda n: int(n.rsplit("-", 1)[1]))  # the one closest to the head's end
        await AgentClient(b.agent_url, http, TOKEN).pull(stage, a.agent_url)  # as if b built it before
        async with gateway([a.spec, b.spec], redis_url, prefix=prefix, agent_token=TOKEN) as gw:
            for slot in range(a.server.slots):
                assert await gw.leases.acquire(SlotRef(a.server.url, slot), "another-replica", 120.0)
            second = await chat(http, gw.url, profile.request(name, user_question(rng), max_tokens=8))
            assert second.status == 200 and second.pod == b.server.url, second
            assert second.action == "restore/restore" and second.snapshot == stage, second
            for _ in range(200):
                if (b.snapshot_dir / f"{head}.bin").exists() and await metric(
                        http, gw.url, "llamafleet_router_snapshot_ships_total", result="ok") == 1:
                    break
                await asyncio.sleep(0.05)
            assert (b.snapshot_dir / f"{head}.bin").exists(), b.files()
            # The next session of that agent on b, in another slot (the second's is taken meanwhile).
            assert await gw.leases.acquire(SlotRef(b.server.url, second.slot), "another-replica", 120.0)
            third = await chat(http, gw.url, profile.request(name, user_question(rng), max_tokens=8))
            pulled = await metric(http, gw.url, "llamafleet_router_snapshot_restores_total",
                                  source="peer", result="ok")
        assert third.status == 200 and third.pod == b.server.url and third.snapshot == head, third
        assert pulled == 0 and third.prompt_n < second.prompt_n, (pulled, second.prompt_n, third.prompt_n)


async def test_bad_snapshots_are_never_restored_and_answers_match_a_cold_run(
    model: tuple[str, Path], start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
    http: httpx.AsyncClient,
) -> None:
    """Greedy answers after a restore equal a cold run's (>= 99% of positions). A corrupt or truncated
    file, a manifest of another model or KV setting, a traversal name in the index, a wrong agent token
    and a peer dying mid-transfer are each refused (a failure counted with its kind), and the client
    still gets the cold run's answer."""
    name, path = model
    profile = make_profile(WorkloadSpec(prefix_chars=SMALL, day=DAY))
    body = {**profile.request(name, "Please check the build.", max_tokens=32, stream=False),
            "logprobs": True}
    async with agent_pod(start_llama_server, path, name, tmp_path / "a", http, flaky=True) as a, \
            agent_pod(start_llama_server, path, name, tmp_path / "b", http) as b:
        cold = await http.post(b.server.url + "/v1/chat/completions", json={**body, "cache_prompt": False})
        want = _tokens(cold.content)
        assert len(want) >= 8

        async def check(answer: Answer) -> None:
            assert answer.status == 200, answer.raw[:300]
            assert _agreement(_tokens(answer.raw), want) >= 0.99, (_tokens(answer.raw), want)

        async with gateway([a.spec], redis_url, prefix=f"f1{name}", agent_token=TOKEN) as gw:
            warm = await chat(http, gw.url, profile.request(name, "Please list files.", max_tokens=4))
            assert warm.action == "compute/first_sight", warm.action
            fs = a.files("fs-")[0].stem
            await _fresh_slots(a, gw, name, http)
            restored = await chat(http, gw.url, body)
            assert restored.action.startswith("restore/") and restored.snapshot == fs, restored.action
            await check(restored)  # correctness after a restore

            for how, kind in (("corrupt", "checksum"), ("truncate", "size"), ("other_model", "fingerprint"),
                              ("other_kv", "fingerprint")):
                await _fresh_slots(a, gw, name, http)
                damage(a, fs, how)
                before = await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                      op="restore", kind=kind)
                answer = await chat(http, gw.url, body)
                after = await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                     op="restore", kind=kind)
                assert after == before + 1, (how, kind, before, after)
                assert answer.snapshot == "" and answer.action == "compute/first_sight", (how, answer.action)
                await check(answer)  # and the first sight saved a good snapshot again

            # A traversal name in the index (a bug, or someone writing to Redis) is never sent anywhere.
            manifest = json.loads((a.snapshot_dir / f"{fs}.json").read_text())
            good = next(s for s in await gw.index.snapshots(name) if s.name == fs)
            await gw.index.record_snapshot(name, dataclasses.replace(good, name="../../../etc/passwd"),
                                           manifest["blocks"])
            await _fresh_slots(a, gw, name, http)
            answer = await chat(http, gw.url, body)
            assert await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                op="restore", kind="name") == 1
            await check(answer)

        async with gateway([a.spec], redis_url, prefix=f"f1{name}", agent_token="wrong") as gw:
            await _fresh_slots(a, gw, name, http)
            answer = await chat(http, gw.url, body)
            assert await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                op="restore", kind="auth") == 1
            assert answer.snapshot == "", answer.action
            await check(answer)

        # The snapshot lives only on a, whose agent dies mid-transfer, and another router replica holds
        # every slot of a: the request lands on b, whose agent must pull the snapshot first.
        async with gateway([b.spec, a.spec], redis_url, prefix=f"f1{name}", agent_token=TOKEN) as gw:
            for slot in range(a.server.slots):
                assert await gw.leases.acquire(SlotRef(a.server.url, slot), "another-replica", 60)
            answer = await chat(http, gw.url, body)
            assert await metric(http, gw.url, "llamafleet_router_snapshot_failures_total",
                                op="pull", kind="peer") == 1
            assert answer.pod == b.server.url and answer.snapshot == "", (answer.pod, answer.action)
            await check(answer)
        local = json.loads((b.snapshot_dir / f"{fs}.json").read_text())
        assert local["source_pod"] == "b", "b computed and saved its own copy; nothing pulled was kept"

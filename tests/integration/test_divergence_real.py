"""Divergence points learned from traffic, through the real gateway (real llama-server, agent, Redis).

The head here changes where no stage rule looks: its date sits inside a paragraph, several lines before
the head's end, so neither "the last line" nor a paragraph start cuts just before it. Day 2 resumes
from the stage at that paragraph's start and computes the paragraph; while building its own head the
gateway saves a `dv-` snapshot where day 2 parts from day 1 and records the point in the index. Day 3
(parting at the same place) restores that snapshot and computes only the date line and what follows.
A hybrid model resumes only from exact snapshots, so this is the case that needs the learned point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from pathlib import Path

import httpx
import pytest

from llamafleet_testbed.workload import AgentProfile, WorkloadSpec, make_profile
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import Answer, chat, gateway
from tests.integration.snapshot_bed import TOKEN, AgentPod, agent_pod
from tests.integration.test_snapshots_real import _epoch, _wait_for_new_epoch, _wait_until_down

pytestmark = [pytest.mark.llama, pytest.mark.redis]

DAY = dt.date(2026, 11, 2)
GUIDE = [f"Guideline {i}: prefer small, reviewed changes and say which files you touched." for i in range(12)]


def profile(day: int) -> AgentProfile:
    """A generated agent head whose last paragraph holds the date on its 5th of 12 lines."""
    base = make_profile(WorkloadSpec(prefix_chars=12_000, seed=21, workspace="/home/dev/svc"))
    date = (DAY + dt.timedelta(days=day)).strftime("%A, %B %d, %Y")
    lines = [*GUIDE[:4], f"The session started on {date}; plan your work for this day.", *GUIDE[4:]]
    return dataclasses.replace(base, system_prompt=base.system_prompt + "\n\n" + "\n".join(lines))


async def _restart(gw_app: object, pod: AgentPod) -> None:
    """Restart the pod: its slots are empty and its index entries purged; its agent keeps the files."""
    epoch = await _epoch(gw_app, pod.server.url)
    pod.server.stop()
    await _wait_until_down(gw_app, pod.server.url)
    await asyncio.to_thread(pod.server.start)
    await _wait_for_new_epoch(gw_app, pod.server.url, epoch)


async def _settled(pod: AgentPod, prefix: str, count: int) -> list[Path]:
    """The pod's `prefix` snapshot files once there are `count` (a detached build ends after its
    request answered); what there is after a bounded wait otherwise."""
    for _ in range(200):
        if len(pod.files(prefix)) >= count:
            break
        await asyncio.sleep(0.05)
    return pod.files(prefix)


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
async def test_a_later_day_learns_where_heads_part_and_the_next_day_resumes_there(
    kind: str, tiny_models: TinyModels, start_llama_server: StartLlamaServer, tmp_path: Path,
    redis_url: str,
) -> None:
    name, path = f"tiny-{kind}", getattr(tiny_models, kind)
    prefix = f"dv{kind}"
    answers: list[Answer] = []
    async with httpx.AsyncClient(timeout=300) as http, \
            agent_pod(start_llama_server, path, name, tmp_path / "a", http, slots=2) as pod, \
            gateway([pod.spec], redis_url, prefix=prefix, agent_token=TOKEN) as gw:
        for day in range(3):
            if day:
                await _restart(gw.app, pod)
            body = profile(day).request(name, f"Day {day + 1}: what should I check first?", max_tokens=4)
            answers.append(await chat(http, gw.url, body))
            await _settled(pod, "fs-", day + 1)
        dv_files = pod.files("dv-")
    day1, day2, day3 = answers
    assert all(a.status == 200 for a in answers), answers
    assert day1.action == "compute/first_sight", day1.action
    # Day 2 resumes from a stage before the date's paragraph and teaches the family where heads part.
    assert day2.action.startswith("restore/") and day2.snapshot.startswith("st-"), day2
    assert len(dv_files) == 1, pod.files()
    # Day 3 restores the learned point's snapshot: it computes less of its head than day 2 did.
    assert day3.action.startswith("restore/") and day3.snapshot.startswith("dv-"), day3
    # Day 2 computed from the paragraph's start; day 3 from the date line: the four lines before it less.
    computed2, computed3 = day2.prompt_tokens - day2.cache_n, day3.prompt_tokens - day3.cache_n
    assert computed3 <= computed2 - 50, (computed2, computed3)
    assert computed3 < 0.1 * day3.prompt_tokens, (computed3, day3.prompt_tokens)

"""The sessions each setup is put through, identical request bodies for every setup.

Every scenario draws its questions from its own seeded generator, so setup (a), (b) and (c) receive
byte-identical requests and their greedy outputs can be compared position by position. Each scenario
also uses its own prefix (another seed or workspace), so nothing one scenario computed helps another.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from llamafleet_testbed.bench.client import Reply, stream_chat
from llamafleet_testbed.workload import AgentProfile, SessionPlan, history_turns, user_question

FIRST_TOKENS = 64  # session 1 keeps generating while sessions 2 and 3 arrive
LATER_TOKENS = 32
STAGGER_S = 0.05  # the 3rd session starts this long after the 2nd: it is the 3rd in every queue
# Earlier turns each of three sessions at once resends (about 80 tokens a turn): KV memory against history
HISTORY_TURNS = (0, 20, 60)


def questions(key: str, n: int) -> list[str]:
    """`n` user questions for scenario `key`: the same in every setup (seeded by the key's text)."""
    rng = random.Random(key)
    return [user_question(rng) for _ in range(n)]


def three_bodies(profile: AgentProfile, model: str, key: str) -> list[dict[str, Any]]:
    """The request bodies of `three_sessions` (also what a cold reference replays), in session order."""
    q = questions(key, 3)
    return [profile.request(model, q[0], max_tokens=FIRST_TOKENS),
            *(profile.request(model, question, max_tokens=LATER_TOKENS) for question in q[1:])]


async def three_sessions(http: httpx.AsyncClient, url: str, profile: AgentProfile, model: str,
                         key: str) -> list[Reply]:
    """Session 1 streams; once it generates (first content event), sessions 2 and 3 start, the 3rd
    `STAGGER_S` after the 2nd. Returns the three replies in session order."""
    bodies = three_bodies(profile, model, key)
    generating = asyncio.Event()
    first = asyncio.create_task(stream_chat(http, url, bodies[0], first_content=generating))
    async with asyncio.timeout(900):
        await generating.wait()
    second = asyncio.create_task(stream_chat(http, url, bodies[1]))
    await asyncio.sleep(STAGGER_S)
    third = await stream_chat(http, url, bodies[2])
    return [await first, await second, third]


async def warm_up(http: httpx.AsyncClient, url: str, profile: AgentProfile, model: str) -> Reply:
    """What a plain deployment can do in place of declaring a prefix: send it once before the sessions."""
    return await stream_chat(http, url, profile.request(model, "Say hello.", max_tokens=1))


def day_bodies(day1: AgentProfile, day2: AgentProfile, model: str, key: str) -> list[dict[str, Any]]:
    """The request bodies of `later_day`, in order."""
    q = questions(key, 3)
    return [day1.request(model, q[0], max_tokens=8), day2.request(model, q[1], max_tokens=LATER_TOKENS),
            day2.request(model, q[2], max_tokens=FIRST_TOKENS)]


async def later_day(http: httpx.AsyncClient, url: str, day1: AgentProfile, day2: AgentProfile, model: str,
                    key: str, between: Callable[[], Awaitable[Any]]) -> list[Reply]:
    """A day-1 session, then `between` (every pod restarts: `restart_all`), then two day-2 sessions one
    after the other (the first finds only what survived; the second may also reuse what the first left)."""
    bodies = day_bodies(day1, day2, model, key)
    replies = [await stream_chat(http, url, bodies[0])]
    await between()
    for body in bodies[1:]:
        replies.append(await stream_chat(http, url, body))
    return replies


async def later_day_from_ram(http: httpx.AsyncClient, url: str, day1: AgentProfile, day2: AgentProfile,
                             other: AgentProfile, model: str, key: str, slots: int) -> list[Reply]:
    """`later_day` with, in between, `slots` sessions of another agent at once, so that no slot holds the
    day-1 head any more and only RAM may (the server's prompt cache, a patched pod's prefix entry); no
    pod restarted."""
    async def other_agent() -> None:
        await asyncio.gather(*(stream_chat(http, url, other.request(model, q, max_tokens=1))
                               for q in questions(f"{key}/other", slots)))

    return await later_day(http, url, day1, day2, model, key, other_agent)


async def three_at_once(http: httpx.AsyncClient, url: str, servers: Sequence[str], profile: AgentProfile,
                        model: str, key: str, restart_all: Callable[[], Any],
                        turns: int = 0) -> tuple[list[Reply], dict[str, Any]]:
    """Every pod restarted (empty slots, and a router that knows it: erasing slots behind its back left
    its index naming content they no longer held), then three sessions of one head at once, each with
    `turns` earlier turns of its own and generating `FIRST_TOKENS` (their decodes overlap); returns the
    replies and the KV cells the servers hold then (`kv_cells`)."""
    await restart_all()
    rng = random.Random(f"{key}/history")
    bodies = [profile.request(model, q, history=history_turns(rng, turns), max_tokens=FIRST_TOKENS)
              for q in questions(key, 3)]
    replies = await asyncio.gather(*(stream_chat(http, url, body) for body in bodies))
    return list(replies), await kv_cells(http, servers)


async def kv_cells(http: httpx.AsyncClient, servers: Sequence[str]) -> dict[str, Any]:
    """The attention KV cells the servers hold, as they say it: a patched build's own count
    (`llamacpp:kv_cells_used`, cells shared between slots counted once), else the tokens `/slots` says
    each slot holds (upstream: every slot its own copy)."""
    total, source = 0, "kv_cells_used"
    for server in servers:
        text = (await http.get(server + "/metrics")).text
        used = [line for line in text.splitlines() if line.startswith("llamacpp:kv_cells_used ")]
        if used:
            total += int(float(used[0].rsplit(" ", 1)[1]))
            continue
        source = "slots"
        total += sum(int(s.get("n_prompt_tokens", 0)) for s in (await http.get(server + "/slots")).json())
    return {"cells": total, "source": source}


async def mixed(http: httpx.AsyncClient, url: str, plans: Sequence[SessionPlan], model: str, *,
                concurrency: int = 4) -> list[Reply]:
    """Replay the sessions `concurrency` at a time (each session's turns in order); replies in plan order."""
    results: list[list[Reply]] = [[] for _ in plans]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(plans)):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            for body in plans[i].requests(model):
                results[i].append(await stream_chat(http, url, body))

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [r for session in results for r in session]


async def prompt_tokens_processed(http: httpx.AsyncClient, servers: Sequence[str]) -> int:
    """Sum of llama-server's `prompt_tokens_total` (tokens computed, cached ones excluded) over servers:
    the only count that also sees the prefills a router makes on its own (first sight, warming)."""
    total = 0
    for url in servers:
        text = (await http.get(url + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("llamacpp:prompt_tokens_total"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def prompt_tokens(http: httpx.AsyncClient, server: str, body: dict[str, Any]) -> list[int]:
    """The token ids llama-server computes for a chat request (rendered by its template, tokenized)."""
    rendered = await http.post(server + "/apply-template", json={
        k: body[k] for k in ("messages", "tools") if k in body})
    rendered.raise_for_status()
    tok = await http.post(server + "/tokenize", json={"content": rendered.json()["prompt"],
                                                      "add_special": True})
    tok.raise_for_status()
    return [int(t) for t in tok.json()["tokens"]]

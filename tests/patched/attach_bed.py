"""What the patched-server tests send and read: a real client's requests, straight to one llama-server.

The requests are Hermes Agent's (its captured layout, `llamafleet_testbed.hermes_layout`): 18 tool
schemas and its system prompt, about 13K tokens on the tiny models' vocabulary, then the user's
question. Greedy (temperature 0) with the generated token ids returned (`logprobs`), so outputs are
compared position by position. Output comparisons run on the `-sharp` tiny models: the plain ones'
logits are nearly uniform, so their outputs barely depend on the prompt and cannot tell a right KV
cache from a wrong one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import httpx

from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec

SPEC = WorkloadSpec(day=dt.date(2026, 11, 2))

# Tiny models, one thread: prefills of 13K tokens take seconds, three at once a little more.
TIMEOUT = httpx.Timeout(600.0, connect=5.0)

# The patched server's flags for sharing, as the fleet will run them (issue part 2)
ATTACH_FLAGS = ("--kv-unified", "--slot-attach", "--metrics")


def body(
    user: str,
    *,
    day: int = 0,
    max_tokens: int = 16,
    slot: int | None = None,
    cache_prompt: bool = True,
    history: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    """Hermes's request for `user` on SPEC's day plus `day`, greedy, its token ids returned."""
    spec = dataclasses.replace(SPEC, day=SPEC.day + dt.timedelta(days=day))
    request = hermes_profile(spec).request("tiny", user, history=history, max_tokens=max_tokens, stream=False)
    request.update(temperature=0, seed=1, logprobs=True, top_logprobs=1, cache_prompt=cache_prompt)
    if slot is not None:
        request["id_slot"] = slot
    return request


def chat(url: str, request: dict[str, Any]) -> dict[str, Any]:
    """One chat completion; the answer's JSON, with `ids` (the generated token ids) and `logprobs` (each
    one's log-probability: a fingerprint of the logits, where ids alone can hide a change) added."""
    resp = httpx.post(url + "/v1/chat/completions", json=request, timeout=TIMEOUT)
    resp.raise_for_status()
    answer: dict[str, Any] = resp.json()
    content = ((answer["choices"][0].get("logprobs") or {}).get("content")) or []
    answer["ids"] = [int(piece["id"]) for piece in content]
    answer["logprobs"] = [float(piece["logprob"]) for piece in content]
    return answer


def prompt_tokens(url: str, request: dict[str, Any]) -> list[int]:
    """The prompt's tokens as the server builds them for a chat request (its own template rendering)."""
    rendered = httpx.post(url + "/apply-template", json=request, timeout=TIMEOUT).json()["prompt"]
    tokens = httpx.post(
        url + "/tokenize",
        json={"content": rendered, "add_special": True, "parse_special": True},
        timeout=TIMEOUT,
    ).json()["tokens"]
    return [int(t) for t in tokens]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def metrics(url: str) -> dict[str, float]:
    """`/metrics` as {name without the `llamacpp:` prefix: value}."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith("llamacpp:") and " " in line and "{" not in line:
            name, value = line.split(" ", 1)
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where two greedy outputs agree, over the longer one (a missing position
    counts as a disagreement)."""
    n = max(len(a), len(b))
    return 1.0 if n == 0 else sum(x == y for x, y in zip(a, b, strict=False)) / n


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference between two answers' log-probabilities, position by position: a finer
    check than the ids, which a small change of the logits leaves the same."""
    return max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=False)), default=0.0)


def erase(url: str, slot: int) -> None:
    httpx.post(f"{url}/slots/{slot}?action=erase", timeout=TIMEOUT).raise_for_status()

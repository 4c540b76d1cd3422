"""A real model through the gateway: SmolLM2-135M-Instruct (fetched from the package index, cached)
on a real upstream llama-server with its agent, a real Redis, the real gateway.

Greedy answers must equal a cold run of the very same server command line, whether the gateway
computed the head on first sight, routed to the slot that holds it, restored its snapshot into an
empty slot, or primed an idle slot with it ahead of the session: at >= 99% of token positions, or up
to a near tie of the cold run's top two candidates (`greedy_equal`). A trained model's answers follow
the prompt, so a reuse that drops or shifts tokens shows as an early, clear parting.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_local.up.contexts import slot_context, trained_context
from llamafleet_testbed.real_models import ensure_real_model
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.fixtures.llama import StartLlamaServer
from tests.integration.gateway_bed import Answer, chat, gateway, settled
from tests.integration.snapshot_bed import TOKEN, agent_pod, metric_reaches
from tests.integration.test_snapshots_real import (
    _agreement,
    _fresh_slots,
    _stream_until_first_byte,
    _tokens,
)

pytestmark = [pytest.mark.llama, pytest.mark.models, pytest.mark.redis]

NAME = "smollm2"
SLOTS, SLOT_CTX = 2, 4096  # under the model's 8K training context: nothing is capped here
DAY = dt.date(2026, 11, 2)
NEAR_TIE = 0.1  # nats: two candidates this close may swap when the same KV is computed in other chunks


def _entries(raw: bytes) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(raw)["choices"][0]["logprobs"]["content"]
    return entries


def greedy_equal(got_raw: bytes, cold_raw: bytes) -> tuple[bool, str]:
    """Whether an answer equals the cold run's: at >= 99% of token positions, or identical up to a
    position where the cold run's top two candidates were a near tie and the answer took the other
    (the KV of one prompt computed in other chunks differs in the last bits; a wrong or shifted KV
    parts at a clear choice). Returns the verdict and what differed."""
    got, want = _tokens(got_raw), _tokens(cold_raw)
    if _agreement(got, want) >= 0.99:
        return True, ""
    first = next(i for i, (a, b) in enumerate(zip([*got, None], [*want, None], strict=False)) if a != b)
    if first >= min(len(got), len(want)):
        return False, f"lengths differ: {len(got)} vs {len(want)} tokens"
    entry = _entries(cold_raw)[first]
    alt = next((t for t in entry.get("top_logprobs", []) if t["token"] == got[first]), None)
    margin = entry["logprob"] - alt["logprob"] if alt is not None else float("inf")
    detail = (f"parts at token {first}: {got[first]!r} for the cold run's {want[first]!r} (margin "
              f"{margin:.3f} nats) after {''.join(want[:first])!r}")
    return margin < NEAR_TIE, detail


async def test_greedy_answers_on_a_real_model_equal_a_cold_run_when_routed_and_restored(
    smollm2_model: Path, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
) -> None:
    # SmolLM2's template renders no tools (llama-server drops them too): the head is all system prompt.
    profile = make_profile(WorkloadSpec(prefix_chars=6_000, tools_share=0.0, day=DAY,
                                        workspace="/home/dev/app"))
    body = {**profile.request(NAME, "Which file should I open first to fix the build?", max_tokens=24,
                              stream=False), "logprobs": True, "top_logprobs": 2}
    assert body.pop("tools") == []
    async with httpx.AsyncClient(timeout=300) as http, \
            agent_pod(start_llama_server, smollm2_model, NAME, tmp_path / "a", http, slots=SLOTS,
                      ctx=SLOTS * SLOT_CTX) as pod, \
            agent_pod(start_llama_server, smollm2_model, NAME, tmp_path / "cold", http, slots=SLOTS,
                      ctx=SLOTS * SLOT_CTX) as plain:
        cold = await http.post(plain.server.url + "/v1/chat/completions",
                               json={**body, "cache_prompt": False})
        assert cold.status_code == 200, cold.text[:300]
        want = _tokens(cold.content)
        text = cold.json()["choices"][0]["message"]["content"]
        # A trained model answers in words (random weights give a soup of unrelated pieces).
        assert len(want) >= 16 and sum(c.isalpha() for c in text) >= 20, text

        def agrees(answer: Answer) -> bool:
            assert answer.status == 200, answer.raw[:300]
            same, detail = greedy_equal(answer.raw, cold.content)
            assert same, (answer.action, detail)
            return same

        async with gateway([pod.spec], redis_url, prefix="rm-smollm2", agent_token=TOKEN) as gw:
            first = await chat(http, gw.url, body)
            assert first.action == "compute/first_sight", first.action
            assert agrees(first)
            await settled(gw)  # the first answer's slot is in the index before the next lookup
            again = await chat(http, gw.url, body)
            assert again.action == "direct/slot_hit" and again.cache_n > 0.9 * again.prompt_tokens, again
            assert agrees(again)
            await _fresh_slots(pod, gw, NAME, http)
            restored = await chat(http, gw.url, body)
            assert restored.action.startswith("restore/") and restored.snapshot, restored.action
            assert restored.cache_n > 0.9 * restored.prompt_tokens, restored
            assert agrees(restored)


async def test_gemma3_is_assembled_from_its_four_chunk_wheels_and_served(
    start_llama_server: StartLlamaServer,
) -> None:
    """Gemma 3 270M (a sliding-window base model): its GGUF, assembled in order and checked against
    the pinned digest, loads in llama-server and completes text."""
    path = ensure_real_model("gemma3-270m")
    assert trained_context(path) == 32768
    server = start_llama_server(path, slots=1, ctx=2048)
    async with httpx.AsyncClient(timeout=120) as http:
        props = (await http.get(server.url + "/props")).json()
        assert slot_context(props) == 2048, props.get("default_generation_settings")
        done = await http.post(server.url + "/completion", json={
            "prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "cache_prompt": False})
    assert done.status_code == 200, done.text[:300]
    body = done.json()
    assert body["tokens_predicted"] == 8 and any(c.isalpha() for c in body["content"]), body["content"]


async def test_a_session_on_a_slot_primed_with_a_real_models_prefix_equals_a_cold_run(
    smollm2_model: Path, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
) -> None:
    """While the first session of a new head still generates, the gateway loads the head's snapshot
    into an idle slot of its pod (priming); the next session lands there, restores nothing on its
    request path, and answers exactly as a cold run."""
    profile = make_profile(WorkloadSpec(prefix_chars=6_000, tools_share=0.0, day=DAY, seed=5,
                                        workspace="/home/dev/svc"))
    first = profile.request(NAME, "Summarise the guidelines.", max_tokens=96) | {"ignore_eos": True}
    body = {**profile.request(NAME, "Which test should I run first?", max_tokens=24, stream=False),
            "logprobs": True, "top_logprobs": 2}
    for request in (first, body):
        assert request.pop("tools") == []
    slots = 3
    async with httpx.AsyncClient(timeout=300) as http, \
            agent_pod(start_llama_server, smollm2_model, NAME, tmp_path / "a", http, slots=slots,
                      ctx=slots * SLOT_CTX) as pod, \
            agent_pod(start_llama_server, smollm2_model, NAME, tmp_path / "cold", http, slots=1,
                      ctx=SLOT_CTX) as plain:
        cold = await http.post(plain.server.url + "/v1/chat/completions",
                               json={**body, "cache_prompt": False})
        assert cold.status_code == 200, cold.text[:300]
        async with gateway([pod.spec], redis_url, prefix="rm-prime", agent_token=TOKEN) as gw:
            started = asyncio.Event()
            leader = asyncio.create_task(_stream_until_first_byte(http, gw.url, first, started))
            await asyncio.wait_for(started.wait(), 300)
            loaded = await metric_reaches(http, gw.url, "llamafleet_router_snapshot_primes_total", 1,
                                          timeout=120, result="loaded")
            assert loaded >= 1, "no idle slot was primed while the first session generated"
            # The session runs alone, as the cold run did: two sequences decoded in one batch round
            # differently from one (llama.cpp's kernels are not batch-invariant), priming or not.
            one = await leader
            primed = await chat(http, gw.url, body)
    assert one.status == 200 and one.action == "compute/first_sight", one.action
    assert primed.action in ("direct/slot_hit", "restore/primed"), (primed.action, primed.snapshot)
    assert primed.slot != one.slot and primed.cache_n > 0.9 * primed.prompt_tokens, primed
    same, detail = greedy_equal(primed.raw, cold.content)
    assert same, detail


def _answer(tokens: list[str], alternatives: dict[int, tuple[str, float]] | None = None) -> bytes:
    """A chat answer's bytes with per-token logprobs; `alternatives`: position -> (token, logprob) of
    the runner-up (the chosen token has logprob -0.5)."""
    content = [{"token": t, "logprob": -0.5,
                "top_logprobs": [{"token": t, "logprob": -0.5},
                                 *([{"token": alt[0], "logprob": alt[1]}]
                                   if (alt := (alternatives or {}).get(i)) else [])]}
               for i, t in enumerate(tokens)]
    return json.dumps({"choices": [{"logprobs": {"content": content}}]}).encode()


def test_greedy_equal_forgives_only_a_parting_at_a_near_tie() -> None:
    cold = _answer(["a", "b", "c", "d"], {2: ("x", -0.55), 1: ("y", -3.0)})
    assert greedy_equal(_answer(["a", "b", "c", "d"]), cold) == (True, "")
    assert greedy_equal(_answer(["a", "b", "x", "z"]), cold)[0]  # parts at a near tie: then anything
    same, detail = greedy_equal(_answer(["a", "y", "c", "d"]), cold)  # parts at a clear choice
    assert not same and "parts at token 1" in detail
    assert not greedy_equal(_answer(["q", "b", "c", "d"]), cold)[0]  # not a candidate at all
    assert not greedy_equal(_answer(["a", "b"]), cold)[0]  # cut short


async def test_a_sliding_window_model_on_upstream_pods_gets_slot_locality_and_no_restores(
    start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
) -> None:
    """Gemma 3 on upstream llama-server resumes no restored slot (agent/restore_check.py): the agent's
    probe says so before the pod turns ready, and the gateway then builds no first-sight snapshot and
    restores none, while a session's resend still goes to the slot holding it (slot locality)."""
    gemma = ensure_real_model("gemma3-270m")
    profile = make_profile(WorkloadSpec(prefix_chars=4_000, tools_share=0.0, day=DAY, workspace="/srv/w"))
    body = {**profile.request("gemma", "Which file comes first?", max_tokens=16, stream=False),
            "logprobs": True, "top_logprobs": 2}
    body.pop("tools")
    async with httpx.AsyncClient(timeout=300) as http, \
            agent_pod(start_llama_server, gemma, "gemma", tmp_path / "a", http, slots=2, ctx=2 * 4096) as pod:
        assert (await http.get(pod.agent_url + "/ready")).json()["restores"] in ("pending", "unusable")
        async with gateway([pod.spec], redis_url, prefix="rm-gemma", agent_token=TOKEN) as gw:
            [status] = await gw.app.state.gateway.discovery.endpoints()
            assert status.endpoint.restores is False, status.endpoint
            first = await chat(http, gw.url, body)
            assert first.status == 200 and first.action.startswith("compute/"), first.action
            assert first.action != "compute/first_sight", "a head was built for snapshots nobody can use"
            await settled(gw)
            again = await chat(http, gw.url, body)
            assert again.action == "direct/slot_hit" and again.cache_n > 0.9 * again.prompt_tokens, again
            await _fresh_slots(pod, gw, "gemma", http)
            cold = await chat(http, gw.url, body)
            assert cold.status == 200 and not cold.action.startswith("restore/"), cold.action
        assert not list(pod.snapshot_dir.glob("*.bin")), "no snapshot is saved on such a pod"
        reference = await http.post(pod.server.url + "/v1/chat/completions",
                                    json={**body, "cache_prompt": False})
        for answer in (first, again, cold):  # computed, from its slot, computed again: a cold run's answer
            same, detail = greedy_equal(answer.raw, reference.content)
            assert same, (answer.action, detail)

"""A real model through the gateway: SmolLM2-135M-Instruct (fetched from the package index, cached)
on a real upstream llama-server with its agent, a real Redis, the real gateway.

Greedy answers must equal a cold run of the very same server command line at >= 99% of token
positions, whether the gateway computed the head on first sight, routed to the slot that holds it, or
restored its snapshot into an empty slot. Random-weight tiny models agree with themselves trivially
often; a trained model's answers follow the prompt, so a reuse that drops or shifts tokens shows.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest

from llamafleet_local.real_models import ensure_real_model
from llamafleet_local.up.contexts import slot_context, trained_context
from llamafleet_local.workload import WorkloadSpec, make_profile
from tests.fixtures.llama import StartLlamaServer
from tests.integration.gateway_bed import Answer, chat, gateway
from tests.integration.snapshot_bed import TOKEN, agent_pod
from tests.integration.test_snapshots_real import _agreement, _fresh_slots, _tokens

pytestmark = [pytest.mark.llama, pytest.mark.models, pytest.mark.redis]

NAME = "smollm2"
SLOTS, SLOT_CTX = 2, 4096  # under the model's 8K training context: nothing is capped here
DAY = dt.date(2026, 11, 2)


async def test_greedy_answers_on_a_real_model_equal_a_cold_run_when_routed_and_restored(
    smollm2_model: Path, start_llama_server: StartLlamaServer, tmp_path: Path, redis_url: str,
) -> None:
    # SmolLM2's template renders no tools (llama-server drops them too): the head is all system prompt.
    profile = make_profile(WorkloadSpec(prefix_chars=6_000, tools_share=0.0, day=DAY,
                                        workspace="/home/dev/app"))
    body = {**profile.request(NAME, "Which file should I open first to fix the build?", max_tokens=24,
                              stream=False), "logprobs": True}
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

        def agrees(answer: Answer) -> float:
            assert answer.status == 200, answer.raw[:300]
            return _agreement(_tokens(answer.raw), want)

        async with gateway([pod.spec], redis_url, prefix="rm-smollm2", agent_token=TOKEN) as gw:
            first = await chat(http, gw.url, body)
            assert first.action == "compute/first_sight", first.action
            assert agrees(first) >= 0.99, (_tokens(first.raw), want)
            again = await chat(http, gw.url, body)
            assert again.action == "direct/slot_hit" and again.cache_n > 0.9 * again.prompt_tokens, again
            assert agrees(again) >= 0.99, (_tokens(again.raw), want)
            await _fresh_slots(pod, gw, NAME, http)
            restored = await chat(http, gw.url, body)
            assert restored.action.startswith("restore/") and restored.snapshot, restored.action
            assert restored.cache_n > 0.9 * restored.prompt_tokens, restored
            assert agrees(restored) >= 0.99, (_tokens(restored.raw), want)


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

"""The facts the design rests on, checked against real llama-server processes and the tiny models.

- A slot reuses what it holds (`timings.cache_n`) for a new question after the same prefix; another
  slot does not (per-slot KV: explicit `-np`, no `-kvu`).
- A prefix-only snapshot (prefill the prefix alone with `n_predict: 0`, save) moves to another server
  and gives full reuse there, for attention-only and hybrid models alike.
- A snapshot of prefix plus one conversation gives a hybrid model nothing for another conversation
  (restoring drops the checkpoints and recurrent state only resumes at exact points), while an
  attention-only model reuses it up to the common prefix.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_core.llama_client import LlamaClient
from llamafleet_local.llama_process import LlamaServerError, LlamaServerProcess
from tests.fixtures.llama import StartLlamaServer, TinyModels

pytestmark = pytest.mark.llama

# A request never needs a whole slot of the default 20K: keep the KV small so servers start fast.
CTX_PER_SLOT = 8192
# How far below the prefix's own token count a "whole prefix" reuse may fall (the server always
# evaluates at least the last prompt token; templates may differ in the final newline).
SLACK = 4


def _system_prompt(rules: int) -> str:
    """A deterministic system prompt of about 20 tokens per rule."""
    return "You are a careful assistant for the llamafleet test bed.\n" + "\n".join(
        f"Rule {i}: when asked about topic {i}, answer in at most {i % 7 + 2} sentences and cite "
        f"section {(i * 7) % 13}.{i % 5}." for i in range(rules)
    )


def _tools(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: looks up record {i} in table {i % 4} and returns its fields.",
            "parameters": {"type": "object", "properties": {
                "record": {"type": "string", "description": f"The id of the record, like R-{i:04d}."},
                "verbose": {"type": "boolean", "description": "Return every field, not only the summary."},
            }, "required": ["record"]},
        }}
        for i in range(count)
    ]


def _body(system: str, question: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0, "max_tokens": 4,
    }
    if tools:
        body["tools"] = tools
    return body


async def _chat(http: httpx.AsyncClient, server: LlamaServerProcess, body: dict[str, Any],
                slot: int) -> dict[str, Any]:
    resp = await http.post(server.url + "/v1/chat/completions", json={**body, "id_slot": slot}, timeout=120)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def _prefix_of(client: LlamaClient, body: dict[str, Any]) -> tuple[str, int]:
    """The rendered prompt cut where the last user turn starts (a special token, so the prefix
    tokenizes the same alone as inside the full prompt), and its token count."""
    prompt = await client.apply_template(body)
    cut = prompt.rindex("<|im_start|>user")
    prefix = prompt[:cut]
    return prefix, len(await client.tokenize(prefix, add_special=True))


@pytest.mark.parametrize("model", ["dense", "hybrid"])
async def test_same_slot_reuses_the_prefix_when_the_question_changes(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, model: str,
) -> None:
    """cache_n covers the system prompt on the same slot, and is 0 on another (empty) slot. For the
    hybrid model this holds because /v1/chat/completions leaves a context checkpoint where the last
    user message starts."""
    server = start_llama_server(getattr(tiny_models, model), slots=2, ctx=2 * CTX_PER_SLOT)
    system = _system_prompt(20)
    async with httpx.AsyncClient() as http:
        _, n_prefix = await _prefix_of(LlamaClient(server.url, http), _body(system, "q"))
        assert n_prefix > 200
        first = await _chat(http, server, _body(system, "What is topic 3 about?"), slot=0)
        assert first["timings"]["cache_n"] == 0
        assert first["usage"]["prompt_tokens"] > n_prefix
        second = await _chat(http, server, _body(system, "And what does rule 11 say?"), slot=0)
        assert second["timings"]["cache_n"] >= n_prefix
        other = await _chat(http, server, _body(system, "Which rule mentions section 4?"), slot=1)
        assert other["timings"]["cache_n"] == 0
        assert other["timings"]["prompt_n"] == other["usage"]["prompt_tokens"]


@pytest.mark.parametrize("model", ["dense", "hybrid"])
async def test_prefix_snapshot_gives_full_reuse_when_restored_on_another_server(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path, model: str,
) -> None:
    """Prefill the prefix alone on A, save, copy the file to B, restore into another slot id: the
    pinned request on B reuses the whole prefix; an untouched slot of B reuses nothing."""
    path = getattr(tiny_models, model)
    dir_a, dir_b = tmp_path / "slots-a", tmp_path / "slots-b"
    a = start_llama_server(path, slots=2, ctx=2 * CTX_PER_SLOT, slot_save_path=dir_a)
    b = start_llama_server(path, slots=2, ctx=2 * CTX_PER_SLOT, slot_save_path=dir_b)
    body = _body(_system_prompt(60), "Look up record R-0007, please.", tools=_tools(12))
    async with httpx.AsyncClient() as http:
        client_a, client_b = LlamaClient(a.url, http), LlamaClient(b.url, http)
        prefix, n_prefix = await _prefix_of(client_a, body)
        assert 2000 < n_prefix < CTX_PER_SLOT // 2
        prefilled = await client_a.prefill(prefix, slot=0, timeout=120)
        assert prefilled["timings"]["prompt_n"] == n_prefix
        saved = await client_a.save_slot(0, "prefix.bin")
        assert saved["n_saved"] == n_prefix
        shutil.copy(dir_a / "prefix.bin", dir_b / "prefix.bin")
        restored = await client_b.restore_slot(1, "prefix.bin")
        assert restored["n_restored"] == n_prefix
        reused = await _chat(http, b, body, slot=1)
        assert reused["timings"]["cache_n"] >= n_prefix - SLACK
        cold = await _chat(http, b, body, slot=0)
        assert cold["timings"]["cache_n"] == 0


@pytest.mark.parametrize("model", ["dense", "hybrid"])
async def test_conversation_snapshot_reuse_depends_on_architecture_when_restored(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path, model: str,
) -> None:
    """A snapshot of prefix + one conversation, restored for a different conversation: an
    attention-only model still reuses the whole prefix, a hybrid one (next to) nothing. The
    prefix-only snapshot gives both full reuse: this is why the design snapshots at the prefix
    boundary."""
    slots = tmp_path / "slots"
    server = start_llama_server(getattr(tiny_models, model), slots=3, ctx=3 * CTX_PER_SLOT,
                                slot_save_path=slots)
    system, tools = _system_prompt(60), _tools(12)
    async with httpx.AsyncClient() as http:
        client = LlamaClient(server.url, http)
        prefix, n_prefix = await _prefix_of(client, _body(system, "q", tools))
        await _chat(http, server, _body(system, "Look up record R-0001.", tools), slot=0)
        conversation = await client.save_slot(0, "conversation.bin")
        assert conversation["n_saved"] > n_prefix
        await client.prefill(prefix, slot=2, timeout=120)
        assert (await client.save_slot(2, "prefix.bin"))["n_saved"] == n_prefix

        await client.restore_slot(1, "conversation.bin")
        other = await _chat(http, server, _body(system, "Look up record R-0002.", tools), slot=1)
        if model == "hybrid":
            assert other["timings"]["cache_n"] <= SLACK
        else:
            assert other["timings"]["cache_n"] >= n_prefix - SLACK

        await client.restore_slot(1, "prefix.bin")
        third = await _chat(http, server, _body(system, "Look up record R-0003.", tools), slot=1)
        assert third["timings"]["cache_n"] >= n_prefix - SLACK


def test_start_fails_with_the_server_log_when_the_model_is_broken(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path,
) -> None:
    """A model that does not load makes `start` raise at once, quoting llama.cpp's own error."""
    broken = tmp_path / "truncated.gguf"
    data = tiny_models.dense.read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(LlamaServerError, match="exited with code") as info:
        start_llama_server(broken, slots=1, ctx=CTX_PER_SLOT)
    assert "truncated.gguf" in str(info.value)
    assert "load" in str(info.value).lower()

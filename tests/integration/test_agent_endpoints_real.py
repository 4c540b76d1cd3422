"""The endpoints agents call, through the gateway against real llama-servers: Anthropic token counts
(Claude Code's `count_tokens`), OpenAI Responses (routed like chat, so a session's prefix is reused),
embeddings (on the pods started with `--embeddings`, a 400 for a model without them), the models'
context length, and Anthropic's errors, including the `event: error` that ends a stream whose pod dies;
and a learned tool list (`api/known_tools.py`) reaching the pod as the same prompt.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llamafleet_testbed.hermes_layout import hermes_profile
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import gateway

pytestmark = [pytest.mark.llama, pytest.mark.redis]

MODEL = "tiny-dense"
SYSTEM = "You are a careful coding agent. " * 300  # a few thousand tokens of shared prefix


def _messages(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "system": SYSTEM, "messages": [{"role": "user", "content": question}], **extra}


def _events(raw: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of every complete SSE event."""
    found = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        lines = block.splitlines()
        data = [ln[6:] for ln in lines if ln.startswith("data: ")]
        if not data:
            continue
        try:
            payload = json.loads(data[0])
        except ValueError:
            continue  # an event the dying pod left half-written
        found.append((next((ln[7:] for ln in lines if ln.startswith("event: ")), None), payload))
    return found


async def test_token_counts_are_the_pods_own_and_match_what_a_generation_reads(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pod = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", MODEL))
    body = _messages("What is a slot?")
    async with gateway([pod.url], redis_url, prefix="ct") as gw, httpx.AsyncClient(timeout=120) as http:
        counted = await http.post(gw.url + "/v1/messages/count_tokens", json=body)
        direct = await http.post(pod.url + "/v1/messages/count_tokens", json=body)
        generated = await http.post(gw.url + "/v1/messages", json={**body, "max_tokens": 1, "temperature": 0})
        bad = await http.post(gw.url + "/v1/messages/count_tokens", json={**body, "max_tokens": 5})
    assert counted.status_code == 200, counted.text
    assert counted.json() == direct.json() and set(counted.json()) == {"input_tokens"}
    usage = generated.json()["usage"]
    assert counted.json()["input_tokens"] == usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert counted.json()["input_tokens"] > 1000
    # A generation's field is refused, in Anthropic's shape.
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error" and "max_tokens" in error["message"]


async def test_responses_are_answered_and_reuse_the_prefix_when_routed(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pods = [start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", MODEL)) for _ in range(2)]

    def body(question: str, **extra: Any) -> dict[str, Any]:
        return {"model": MODEL, "instructions": SYSTEM, "input": question, "max_output_tokens": 8,
                "temperature": 0, **extra}

    async with gateway([p.url for p in pods], redis_url, prefix="rs") as gw, \
            httpx.AsyncClient(timeout=120) as http:
        first = await http.post(gw.url + "/v1/responses", json=body("What is a slot?"))
        second = await http.post(gw.url + "/v1/responses", json=body("What is a prefix?", input=[
            {"role": "user", "content": "What is a prefix?"}]))
        streamed = await http.post(gw.url + "/v1/responses", json=body("And a snapshot?", stream=True))
        refused = await http.post(gw.url + "/v1/responses", json=body("x", previous_response_id="resp_1"))
        tools = await http.post(gw.url + "/v1/responses", json=body("x", tools=[{"type": "web_search"}]))
    for resp in (first, second):
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["object"] == "response" and answer["status"] == "completed"
        assert answer["output"] and all(item["type"] in ("message", "reasoning", "function_call")
                                        for item in answer["output"])
        assert answer["usage"]["output_tokens"] > 0 and answer["usage"]["input_tokens"] > 1000
    assert first.json()["usage"]["input_tokens_details"]["cached_tokens"] == 0
    # The second session went where the instructions were computed, and the server read them from there.
    assert second.headers["x-llamafleet-pod"] == first.headers["x-llamafleet-pod"]
    assert second.json()["usage"]["input_tokens_details"]["cached_tokens"] > 1000
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    kinds = [data["type"] for _, data in _events(streamed.text)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert any(kind.endswith(".delta") for kind in kinds), kinds
    for resp, param in ((refused, "previous_response_id"), (tools, "tools[0]")):
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


async def test_embeddings_go_to_the_pods_that_serve_them(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    embedder = start_llama_server(tiny_models.dense, slots=2,
                                  extra_args=("-a", MODEL, "--embeddings", "--pooling", "mean"))
    plain = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", MODEL))
    ask = {"model": MODEL, "input": ["hello there", "general kenobi"]}
    async with httpx.AsyncClient(timeout=120) as http:
        async with gateway([plain.url, embedder.url], redis_url, prefix="em1") as gw:
            answers = [await http.post(gw.url + "/v1/embeddings", json=ask) for _ in range(3)]
            listed = (await http.get(gw.url + "/v1/models")).json()
            one = await http.get(gw.url + f"/v1/models/{MODEL}")
            unknown = await http.get(gw.url + "/v1/models/nope")
        async with gateway([plain.url], redis_url, prefix="em2") as gw:
            without = await http.post(gw.url + "/v1/embeddings", json=ask)
        own = (await http.post(embedder.url + "/v1/embeddings", json=ask)).json()
        n_embd = len(own["data"][0]["embedding"])
        slot_ctx = (await http.get(plain.url + "/props")).json()["default_generation_settings"]["n_ctx"]
    for resp in answers:
        assert resp.status_code == 200, resp.text
        data = resp.json()["data"]
        assert [d["index"] for d in data] == [0, 1] and all(len(d["embedding"]) == n_embd for d in data)
        assert data[0]["embedding"] != data[1]["embedding"]
    assert without.status_code == 400 and without.json()["error"]["code"] == "model_not_embedding"
    # What one slot holds, as the pods report it (after any cap to the model's training context).
    [entry] = listed["data"]
    assert entry["id"] == MODEL and entry["context_length"] == slot_ctx == entry["max_model_len"] > 0
    assert one.status_code == 200 and one.json() == entry
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


async def test_an_anthropic_stream_whose_pod_dies_ends_with_an_error_event(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pod = start_llama_server(tiny_models.dense, slots=1, extra_args=("-a", MODEL))
    body = _messages("Tell me a long story.", max_tokens=8000, stream=True, temperature=0)
    async with gateway([pod.url], redis_url, prefix="cut") as gw, httpx.AsyncClient(timeout=120) as http:
        unknown = await http.post(gw.url + "/v1/messages", json={**body, "model": "nope", "stream": False})
        raw = ""
        async with http.stream("POST", gw.url + "/v1/messages", json=body) as resp:
            assert resp.status_code == 200
            async for text in resp.aiter_text():
                raw += text
                if pod.proc is not None and "content_block_delta" in raw:
                    os.killpg(pod.proc.pid, signal.SIGSTOP)  # frozen mid-generation: it cannot finish now
                    pod.kill()
    assert unknown.status_code == 404
    assert unknown.json() == {"type": "error", "error": {"type": "not_found_error",
                                                         "message": unknown.json()["error"]["message"]}}
    events = _events(raw)
    assert all(data.get("type") != "message_stop" for _, data in events)
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error", events[-3:]


async def test_the_official_sdks_call_the_new_endpoints_unchanged(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    """openai's `responses.create` (plain and streamed, its events parsed by the SDK) and
    `embeddings.create` (base64 by default, decoded by the SDK), anthropic's `messages.count_tokens`,
    and both SDKs' error types for the gateway's own errors."""
    embedder = start_llama_server(tiny_models.dense, slots=2,
                                  extra_args=("-a", MODEL, "--embeddings", "--pooling", "mean"))
    async with gateway([embedder.url], redis_url, prefix="sdk") as gw:
        oai = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        claude = anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0)
        answer = await oai.responses.create(model=MODEL, instructions="Be terse.", input="Hi",
                                            max_output_tokens=8, temperature=0)
        kinds = [event.type async for event in await oai.responses.create(
            model=MODEL, input="Hi", max_output_tokens=8, temperature=0, stream=True)]
        vectors = await oai.embeddings.create(model=MODEL, input=["a", "b"])
        hi: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Hi"}]
        counted = await claude.messages.count_tokens(model=MODEL, messages=hi)
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await oai.responses.create(model=MODEL, input="Hi", previous_response_id="resp_1")
        with pytest.raises(anthropic.NotFoundError):
            await claude.messages.count_tokens(model="nope", messages=hi)
        model = await oai.models.retrieve(MODEL)
    assert answer.status == "completed" and answer.usage is not None and answer.usage.output_tokens > 0
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 0
    assert all(isinstance(x, float) for x in vectors.data[0].embedding)
    assert counted.input_tokens > 0
    assert model.id == MODEL and (model.model_extra or {}).get("context_length", 0) > 0


async def test_a_learned_tool_list_reaches_the_pod_as_the_same_prompt(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    """Hermes Agent's 18 tools through the openai SDK: from the third request on the gateway parses
    only the rest of the body and forwards the tools' bytes as the client wrote them; the pod counts
    the same prompt tokens as for the same request sent to it directly."""
    pod = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", MODEL))
    profile = hermes_profile(model=MODEL)
    bodies = [profile.request(MODEL, f"Question {i}?", max_tokens=1, stream=False) for i in range(3)]
    async with gateway([pod.url], redis_url, prefix="kt") as gw:
        oai = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        direct = openai.AsyncOpenAI(base_url=pod.url + "/v1", api_key="unused", max_retries=0)
        routed = [await oai.chat.completions.create(**body) for body in bodies]
        expected = await direct.chat.completions.create(**bodies[-1])
        spans = gw.app.state.gateway.tool_spans
    assert spans.learned == 1 and spans.hits == 1
    assert routed[-1].usage is not None and expected.usage is not None
    assert routed[-1].usage.prompt_tokens == expected.usage.prompt_tokens > 10_000

"""Anthropic Messages (`POST /v1/messages`) through the gateway against a real llama-server: some agent
clients speak it, and its prompts must be routed to the slot holding their prefix like chat ones."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import gateway

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SYSTEM = "You are a careful coding agent. " * 300  # a few thousand tokens of shared prefix


def _body(question: str, stream: bool = False) -> dict[str, object]:
    return {"model": "tiny-dense", "max_tokens": 8, "temperature": 0, "stream": stream, "system": SYSTEM,
            "messages": [{"role": "user", "content": question}]}


async def test_messages_are_answered_and_reuse_the_prefix_when_routed(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pods = [start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", "tiny-dense")) for _ in range(2)]
    urls = [p.url for p in pods]
    async with gateway(urls, redis_url, prefix="m1") as gw, httpx.AsyncClient(timeout=120) as http:
        first = await http.post(gw.url + "/v1/messages", json=_body("What is a slot?"))
        second = await http.post(gw.url + "/v1/messages", json=_body("What is a prefix?"))
        streamed = await http.post(gw.url + "/v1/messages", json=_body("And a snapshot?", stream=True))
    for resp in (first, second):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["type"] == "message" and body["role"] == "assistant"
    assert first.json()["usage"].get("cache_read_input_tokens", 0) == 0
    # Same pod and slot as the first: the server read the shared system prompt from its cache.
    assert second.headers["x-llamafleet-pod"] == first.headers["x-llamafleet-pod"]
    assert second.json()["usage"]["cache_read_input_tokens"] > 1000
    assert streamed.status_code == 200
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events and events[-1]["type"] == "message_stop"

"""Bad input through the gateway to a REAL llama-server gets a clear 4xx, never a 5xx.

Each body below is first sent to the pod directly: llama-server answers it with a 500 (a C++ exception,
or its chat template's `raise_exception`), so the case is real. Through the gateway (in process, over
the same pod) each one gets a 400 naming the offending place, before anything is scheduled. A tool
schema or `metadata` nested 490 deep is one the pod takes (or refuses with a 400), but the gateway
itself failed on it (its encoder went past Python's recursion limit): it is refused by depth.
llama-server's own fields get a 400 naming them (`n: 2`, which the pod answers with two choices from
two slots), and a length past the key's cap is lowered to it, while what real clients send (tool
calls, Anthropic tool use, template kwargs) passes.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_router.app import create_app
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.settings import RouterSettings
from tests.fixtures.llama import StartLlamaServer, TinyModels

pytestmark = [pytest.mark.llama]

MODEL = "tiny-dense"
CAP = 8  # the gateway's max_tokens_per_request here: every answer stays short on the tiny model
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"
USER = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": list(messages) or [USER], **fields}


def anthropic(*content: Any, role: str = "user") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": role, "content": list(content)}]}


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
TOOL_USE = {"type": "tool_use", "id": "t", "name": "f", "input": "x"}
RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "r"}
NOT_JSON = {**CALL, "function": {"name": "f", "arguments": "not json"}}
# name: (path, body, the param the gateway's 400 names)
POD_500 = {
    "content part of a type the model cannot take": (
        CHAT, chat({"role": "user", "content": [IMAGE]}), "messages[0].content[0]"),
    "content part whose text is not a string": (
        CHAT, chat({"role": "user", "content": [{"type": "text", "text": 3}]}),
        "messages[0].content[0].text"),
    "chat_template_kwargs replacing messages": (
        CHAT, chat(chat_template_kwargs={"messages": "x"}), "chat_template_kwargs.messages"),
    "chat_template_kwargs replacing add_generation_prompt": (
        CHAT, chat(chat_template_kwargs={"add_generation_prompt": "x"}),
        "chat_template_kwargs.add_generation_prompt"),
    "anthropic block of an unexpected type": (MESSAGES, anthropic(DOCUMENT), "messages[0].content[0].type"),
    "anthropic block of an unknown type": (
        MESSAGES, anthropic({"type": "foo"}), "messages[0].content[0].type"),
    "anthropic message without blocks": (MESSAGES, anthropic(), "messages[0].content"),
    "anthropic tool_use whose input is not an object": (MESSAGES, {
        "model": MODEL, "max_tokens": 2, "messages": [
            USER, {"role": "assistant", "content": [TOOL_USE]}, {"role": "user", "content": [RESULT]}]},
        "messages[1].content[0].input"),
    "anthropic system role": (
        MESSAGES, {"model": MODEL, "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]},
        "messages[0].role"),
    "a tool that is not a function": (
        CHAT, chat(tools=[{"type": "custom", "custom": {"name": "f"}}]), "tools[0].type"),
    "a tool without a name": (
        CHAT, chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
    "tool parameters that are not an object": (
        CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters"),
    "tool-call arguments that are not JSON": (
        CHAT, chat(USER, {"role": "assistant", "tool_calls": [NOT_JSON]},
                   {"role": "tool", "tool_call_id": "c1", "content": "r"}),
        "messages[1].tool_calls[0].function.arguments"),
    "an unknown role": (
        CHAT, chat({"role": "function", "name": "f", "content": "x"}, USER), "messages[0].role"),
    "no user message": (CHAT, chat({"role": "system", "content": "x"}), "messages"),
}


def nested(depth: int, field: str = "tools") -> bytes:
    """A chat body with a JSON schema nesting `depth` objects in `field` (a tool's parameters, or a
    field the prompt does not render), written as text: too deep to dump."""
    schema = '{"type":"object","properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth
    if field == "tools":
        body = chat(tools=[{"type": "function", "function": {"name": "f", "parameters": None}}])
        return json.dumps(body).replace('"parameters": null', '"parameters": ' + schema).encode()
    return json.dumps(chat(**{field: None})).replace(f'"{field}": null', f'"{field}": ' + schema).encode()


@contextlib.asynccontextmanager
async def gateway_over(start: StartLlamaServer, models: TinyModels) -> AsyncIterator[tuple[str, str]]:
    """(pod URL, gateway URL): one real llama-server, a gateway in process as `llamafleet router` builds
    it (memory index), with a length cap of CAP tokens."""
    pod = start(models.dense, slots=2, extra_args=("-a", MODEL))
    settings = RouterSettings(pods=[pod.url], poll_interval=0.2, max_tokens_per_request=[str(CAP)])
    app = create_app(settings, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(),
                     discovery=lambda http, fence: StaticDiscovery(
                         settings.pod_specs, http, poll_interval=0.2, fence=fence))
    async with serve(app) as url, httpx.AsyncClient(timeout=30) as http:
        for _ in range(300):  # until discovery has seen the pod up
            if (await http.get(url + "/health")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        yield pod.url, url


async def post(http: httpx.AsyncClient, url: str, body: dict[str, Any] | bytes) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await http.post(url, content=raw, headers={"content-type": "application/json"})


async def test_what_the_pod_answers_with_a_500_gets_a_400_naming_the_place(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels,
) -> None:
    async with gateway_over(start_llama_server, tiny_models) as (pod, gw), \
            httpx.AsyncClient(timeout=60) as http:
        for name, (path, body, param) in POD_500.items():
            direct = await post(http, pod + path, body)
            assert direct.status_code == 500, (name, direct.status_code, direct.text[:200])
            resp = await post(http, gw + path, body)
            assert resp.status_code == 400, (name, resp.status_code, resp.text[:300])
            error = resp.json()["error"]
            assert error["type"] == "invalid_request_error", (name, resp.text)
            assert f"`{param}`" in error["message"], (name, resp.text)
            if path == MESSAGES:
                assert resp.json()["type"] == "error", resp.text  # Anthropic's error shape
        # The pod takes these: it was the gateway that answered 500 (its encoder past the recursion limit).
        for deep in (nested(490, "response_format"), nested(490, "metadata"), nested(500)):
            assert (await post(http, pod + CHAT, deep)).status_code in (200, 400)
            resp = await post(http, gw + CHAT, deep)
            assert resp.status_code == 400, resp.text[:300]
            assert "nested deeper" in resp.json()["error"]["message"], resp.text[:300]
        assert (await post(http, gw + CHAT, nested(10))).status_code == 200


async def test_llama_server_fields_get_400_naming_them_and_lengths_stay_under_the_cap(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels,
) -> None:
    async with gateway_over(start_llama_server, tiny_models) as (pod, gw), \
            httpx.AsyncClient(timeout=60) as http:
        two = await post(http, pod + CHAT, chat(n=2))
        assert two.status_code == 200 and len(two.json()["choices"]) == 2  # two slots for one request
        for name, value in {"n": 2, "n_cmpl": 2, "lora": [{"id": 0, "scale": 5.0}], "n_probs": 150000,
                            "n_keep": -1, "samplers": ["dry"], "t_max_predict_ms": -1}.items():
            resp = await post(http, gw + CHAT, chat(**{name: value}))
            assert resp.status_code == 400, (name, resp.text)
            assert f"`{name}`" in resp.json()["error"]["message"] and resp.json()["error"]["param"] == name
        long = await post(http, gw + CHAT, chat(max_tokens=1_000_000_000, ignore_eos=True))
        assert long.status_code == 200, long.text[:300]
        assert long.json()["usage"]["completion_tokens"] == CAP
        unset = await post(http, gw + "/v1/completions", {"model": MODEL, "prompt": "hi", "ignore_eos": True})
        assert unset.status_code == 200, unset.text[:300]
        assert unset.json()["usage"]["completion_tokens"] == CAP


async def test_what_real_clients_send_is_answered(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels,
) -> None:
    """Tool calls and their results, a developer message, typed content, template kwargs, Anthropic's
    tool use with thinking and a prefilled answer: 200, as from the pod itself."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}}}}}
    call = {**CALL, "function": {"name": "f", "arguments": '{"path": "a"}'}}
    openai_agent = chat(
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "read it"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        tools=[tool], tool_choice="auto", chat_template_kwargs={"enable_thinking": False}, stream=True,
        stream_options={"include_usage": True})
    cached = {"type": "text", "text": "read it", "cache_control": {"type": "ephemeral"}}
    thought = {"type": "thinking", "thinking": "t", "signature": "s"}
    used = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "done"}]}
    anthropic_agent = {
        "model": MODEL, "max_tokens": 2, "system": [{"type": "text", "text": "be brief"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "messages": [
            {"role": "user", "content": [cached]}, {"role": "assistant", "content": [thought, used]},
            {"role": "user", "content": [result]}, {"role": "assistant", "content": "So"}]}
    bodies = [(CHAT, openai_agent), (MESSAGES, anthropic_agent)]
    async with gateway_over(start_llama_server, tiny_models) as (pod, gw), \
            httpx.AsyncClient(timeout=60) as http:
        for path, body in bodies:
            assert (await post(http, pod + path, body)).status_code == 200
            resp = await post(http, gw + path, body)
            assert resp.status_code == 200, (path, resp.text[:300])

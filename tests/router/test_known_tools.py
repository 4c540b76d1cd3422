"""Tool lists found by their bytes (api/known_tools.py): every parse equals the full parse, whatever the
layout and however a body tries to mislead the splice; the learned value's depth still counts against
the bound; the learned bytes go to the pod as the client wrote them; through the gateway, with the
openai SDK sending Hermes Agent's real layout, nothing changes the shared value; and the anthropic
SDK's tools, the same schemas in Anthropic's shape, are converted to chat tools once."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import orjson
import pytest

from llamafleet_router.api.anthropic import chat_tools
from llamafleet_router.api.known_tools import ToolSpans
from llamafleet_router.api.nesting import body_too_deep, depth, too_deep
from llamafleet_router.api.parse import Route, parse_request
from llamafleet_router.inprocess import app_client, serve
from llamafleet_router.proxy.forward import encoded_body
from llamafleet_testbed.hermes_layout import hermes_profile
from tests.router.conftest import AppFactory
from tests.router.fakes import FakeFleet

TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "Does a thing. " * 20 + "Ünïcode — ok.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["a", "b"]}},
                   "required": ["path"]}}} for i in range(8)]


def chat(question: str, tools: Any = TOOLS, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "system", "content": "You are an agent."},
                                          {"role": "user", "content": question}],
            "tools": tools, "stream": False, **extra}


def learned(spans: ToolSpans, encode: Any = json.dumps, group: str = "") -> None:
    """Two sightings: the second one learns."""
    for question in ("first?", "second?"):
        parsed = parse_request(Route.CHAT, encode(chat(question)).encode(), spans, group)
        assert parsed.known_tools is None
    assert spans.learned == 1


def both(raw: bytes, spans: ToolSpans, group: str = "") -> tuple[Any, Any]:
    """The parse with the learned lists, and the full parse of the same bytes."""
    return parse_request(Route.CHAT, raw, spans, group), parse_request(Route.CHAT, raw)


def test_a_tool_list_is_learned_on_its_second_sighting_and_shared_from_the_third() -> None:
    spans = ToolSpans()
    learned(spans)
    fast, full = both(json.dumps(chat("third?")).encode(), spans)
    assert fast.known_tools is not None and spans.hits == 1
    assert fast.body == full.body and list(fast.body) == list(full.body)  # same values, same key order
    assert fast.body["tools"] is fast.known_tools.value  # one object, shared by every later request
    again = parse_request(Route.CHAT, json.dumps(chat("fourth?")).encode(), spans)
    assert again.body["tools"] is fast.body["tools"]


@pytest.mark.parametrize("encode", [
    json.dumps,  # the standard library's default: ", " and ": ", ASCII escapes
    lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False),  # httpx's, and JavaScript's
    lambda b: json.dumps(b, indent=2),
    lambda b: orjson.dumps({"tools": b["tools"], **{k: v for k, v in b.items() if k != "tools"}}).decode(),
], ids=["python", "compact", "indented", "tools-first"])
def test_every_layout_parses_as_the_full_parse(encode: Any) -> None:
    spans = ToolSpans()
    learned(spans, encode)
    fast, full = both(encode(chat("third?")).encode(), spans)
    assert fast.known_tools is not None
    assert fast.body == full.body and list(fast.body) == list(full.body)


def misleading_bodies() -> dict[str, bytes]:
    listed = json.dumps(TOOLS)
    return {
        # The learned bytes inside a message's own "tools" key, before the top-level one.
        "nested-first": json.dumps({"model": "tiny", "messages": [
            {"role": "user", "content": "hi", "tools": TOOLS}], "tools": TOOLS[:2]}).encode(),
        # The same, with the top-level tools the learned ones too: one splice at most, then the full parse.
        "nested-and-top": json.dumps({"model": "tiny", "messages": [
            {"role": "user", "content": "hi", "tools": TOOLS}], "tools": TOOLS}).encode(),
        # A question quoting the learned list as text.
        "quoted": json.dumps(chat(f'what does "tools": {listed} do?', tools=TOOLS[:1])).encode(),
        # Two top-level keys: JSON parsers keep the last.
        "duplicate-key": (b'{"model":"tiny","tools":' + listed.encode() + b',"messages":[{"role":"user",'
                          b'"content":"hi"}],"tools":' + json.dumps(TOOLS[:3]).encode() + b'}'),
        # A guess at the marker as the top-level value.
        "marker-guess": json.dumps({"model": "tiny", "messages": [
            {"role": "user", "content": "hi", "tools": TOOLS}],
            "tools": "llamafleet-known-tools:" + "0" * 32}).encode(),
        # One byte off in the list.
        "changed": json.dumps(chat("hi", tools=[*TOOLS[:-1], {**TOOLS[-1], "type": "functiom"}])).encode(),
    }


@pytest.mark.parametrize("case", sorted(misleading_bodies()))
def test_a_misleading_body_still_parses_as_the_full_parse(case: str) -> None:
    spans = ToolSpans()
    learned(spans)
    raw = misleading_bodies()[case]
    assert spans.parse(raw, "") is None  # the caller parses the whole body
    parsed = parse_request(Route.CHAT, raw, spans) if case in ("nested-first", "nested-and-top") else None
    if parsed is not None:  # and learns nothing from it: the list is known, the top-level key is no copy
        assert parsed.body == json.loads(raw) and spans.learned == 1


def test_tools_after_a_message_that_mentions_them_are_found() -> None:
    spans = ToolSpans()
    learned(spans)
    raw = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi", "note": "tools"}],
                      "tools": TOOLS}).encode()
    found = spans.parse(raw, "")
    assert found is not None and found[0] == json.loads(raw)


def test_learned_lists_are_per_tenant_group_and_bounded() -> None:
    spans = ToolSpans(max_entries=2)
    learned(spans, group="team-a")
    assert parse_request(Route.CHAT, json.dumps(chat("x")).encode(), spans, "team-b").known_tools is None
    assert parse_request(Route.CHAT, json.dumps(chat("x")).encode(), spans, "team-a").known_tools is not None
    for n in (2, 3):  # two more lists of team-a push the first out
        other = [{**t, "type": "function", "function": {**t["function"], "name": f"v{n}"}} for t in TOOLS]
        for question in ("a", "b"):
            parse_request(Route.CHAT, json.dumps(chat(question, tools=other)).encode(), spans, "team-a")
    assert spans.learned == 3
    assert parse_request(Route.CHAT, json.dumps(chat("x")).encode(), spans, "team-a").known_tools is None

    small, large = ToolSpans(min_bytes=10**6), ToolSpans(max_bytes=100)
    for spans in (small, large):
        for question in ("a", "b", "c"):
            assert parse_request(Route.CHAT, json.dumps(chat(question)).encode(), spans).known_tools is None
        assert spans.learned == 0


@pytest.mark.parametrize("limit", range(1, 12))
def test_a_known_depth_counts_as_walking_the_body(limit: int) -> None:
    deep_tools = [{"function": {"parameters": {"properties": {"a": {"items": [[1]]}}}}}]
    bodies = [chat("q", tools=deep_tools), chat("q", tools=TOOLS), {**chat("q"), "metadata": [[[[[[[1]]]]]]]}]
    for body in bodies:
        known = (body["tools"], depth(body["tools"]))
        assert body_too_deep(body, limit, known) == too_deep(body, limit)
        assert body_too_deep(body, limit, ([], 1)) == too_deep(body, limit)  # not the body's: walked


def test_the_learned_bytes_are_forwarded_as_the_client_wrote_them() -> None:
    spans = ToolSpans()
    learned(spans)
    parsed = parse_request(Route.CHAT, json.dumps(chat("third?", id_slot=3)).encode(), spans)
    known = parsed.known_tools
    assert known is not None
    sent = encoded_body(parsed.body, {"tools": known.raw})
    assert known.raw in sent and b'"id_slot"' not in sent  # the client's slot is dropped
    unpinned = {k: v for k, v in parsed.body.items() if k != "id_slot"}
    assert orjson.loads(sent) == unpinned and list(orjson.loads(sent)) == list(unpinned)
    # An integer past 64 bits: the standard encoder writes the body, with the same values.
    huge = {**parsed.body, "n_probs": 2**70}
    assert json.loads(encoded_body(huge, {"tools": known.raw})) == {**unpinned, "n_probs": 2**70}


async def test_through_the_gateway_the_openai_sdk_on_hermes_layout_shares_one_unchanged_value(
    make_app: AppFactory, fleet: FakeFleet,
) -> None:
    profile = hermes_profile()
    app = make_app()
    sent = [profile.request("tiny", f"question {i}?", stream=False) for i in range(5)]
    async with app_client(app) as http:
        client = openai.AsyncOpenAI(base_url="http://router/v1", api_key="unused", http_client=http,
                                    max_retries=0)
        for body in sent:
            await client.chat.completions.create(**body)
    spans: ToolSpans = app.state.gateway.tool_spans
    assert spans.learned == 1 and spans.hits == 3
    forwarded = [r["body"] for pod in fleet.pods.values() for r in pod.requests]
    assert len(forwarded) == len(sent)
    for body in forwarded:
        assert {k: v for k, v in body.items() if k not in ("id_slot", "cache_prompt")} in sent
    entry = spans._entries[0][1]
    assert entry.value == orjson.loads(entry.raw) == list(profile.tools)  # unchanged by five requests
    registry = app.state.gateway.metrics.registry
    assert registry.get_sample_value("llamafleet_router_known_tools_reused_total") == 3
    assert registry.get_sample_value("llamafleet_router_known_tool_lists") == 1


async def test_the_anthropic_sdk_s_tools_are_converted_once_and_keyed_by_identity(
    make_app: AppFactory, fleet: FakeFleet,
) -> None:
    profile = hermes_profile()
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in profile.tools]
    app = make_app()
    async with serve(app) as url:  # the SDK brings its own HTTP client: a real socket
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        for i in range(5):
            await client.messages.with_raw_response.create(
                model="tiny", max_tokens=8, system=profile.system_prompt, tools=tools,  # type: ignore[arg-type]
                messages=[{"role": "user", "content": f"question {i}?"}])
    gateway = app.state.gateway
    assert gateway.tool_spans.hits == 3
    learned_value = gateway.tool_spans._entries[0][1].value
    conversions = [chat for source, chat in gateway.prompts._chat_tools.values() if source is learned_value]
    assert len(conversions) == 1 and conversions[0] == chat_tools(tools)  # one conversion for three requests
    forwarded = [r["body"] for pod in fleet.pods.values() for r in pod.requests]
    assert len(forwarded) == 5 and all(body["tools"] == tools for body in forwarded)

"""The local rendering is byte-identical to llama-server's `/apply-template`, and the session prefix
tokenizes to a token prefix of the full prompt (so a slot holding it can be extended)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_core.prefix import ChatTemplate, chat_identity, render_chat

pytestmark = pytest.mark.llama

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file. Ünïcode — «quotes» \"escaped\" \\ and\ttabs",
        "strict": True,
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Where"},
            "limit": {"type": "integer", "minimum": 1, "default": 2.0, "ratio": 0.1234567},
            "flags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}},
            "required": ["path"]}}},
    {"type": "function", "function": {"name": "run", "description": "Run a command",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "no_params"}},
]


def call(i: int, name: str, args: Any) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "Hello there"}]},
    "system_and_tools": {"messages": [{"role": "system", "content": "You are a careful agent.\n  "},
                                      {"role": "user", "content": "  list files  "}], "tools": TOOLS},
    "multi_turn_tool_calls": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "need to read",
         "tool_calls": [call(1, "read_file", '{"path": "a.txt", "limit": 3, "flags": ["a"]}'),
                        call(2, "run", {"cmd": "ls -la", "n": 1.5, "ok": True, "nested": {"x": [1, None]}})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "contents of a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "total 0"},
        {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nDone reading."},
        {"role": "user", "content": "now summarise"},
    ]},
    "tool_result_last": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [call(3, "run", "{}")]},
        {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
    ]},
    "content_parts_and_developer": {"messages": [
        {"role": "developer", "content": "Dev rules"},
        {"role": "user", "content": [{"type": "text", "text": "part one"},
                                     {"type": "text", "text": "part two"}]},
    ]},
    "thinking_off": {"messages": [{"role": "user", "content": "quick"}],
                     "chat_template_kwargs": {"enable_thinking": False}},
    "unicode": {"messages": [{"role": "system", "content": "日本語 😀 é"},
                             {"role": "user", "content": "emoji 😀\u2028 line"}], "tools": TOOLS[:1]},
}


@pytest.fixture(params=["dense", "dense_q3"], ids=["qwen35-template", "qwen3-template"])
def server(request: pytest.FixtureRequest, start_llama_server: Any, tiny_models: Any) -> Iterator[str]:
    model: Path = getattr(tiny_models, request.param)
    yield start_llama_server(model, slots=1).url


def tokenize(http: httpx.Client, url: str, text: str) -> list[int]:
    r = http.post(url + "/tokenize", json={"content": text, "add_special": True})
    r.raise_for_status()
    return list(r.json()["tokens"])


def test_local_render_equals_apply_template_and_session_prefix_is_a_token_prefix(server: str) -> None:
    with httpx.Client(timeout=60) as http:
        props = http.get(server + "/props").json()
        template = ChatTemplate.from_props(props)
        guessed = ChatTemplate(source=props["chat_template"])  # caps from the source-text heuristic
        for name, body in REQUESTS.items():
            r = http.post(server + "/apply-template", json=body)
            assert r.status_code == 200, (name, r.text)
            expected = r.json()["prompt"]
            local = render_chat(template, json.loads(json.dumps(body)))
            assert local.path == "template", (name, local.error)
            assert local.text == expected, name
            assert render_chat(guessed, body).text == expected, name

            ident = chat_identity(body, template, model="tiny", block_chars=64)
            assert ident.text == expected
            assert 0 <= ident.session_prefix_chars < len(ident.text), name
            if ident.session_prefix_chars:
                assert ident.text[ident.session_prefix_chars:].startswith("<|im_start|>user"), name
            full = tokenize(http, server, ident.text)
            prefix = tokenize(http, server, ident.text[: ident.session_prefix_chars])
            assert full[: len(prefix)] == prefix, name


GEMMA_CONVERSATION = {"messages": [
    {"role": "system", "content": "You review pull requests. Be brief."},
    {"role": "user", "content": "Look at a.py"},
    {"role": "assistant", "content": "It reads a file twice."},
    {"role": "user", "content": "And b.py?"},
]}


@pytest.mark.models
def test_gemma3s_template_renders_as_llama_server_does_and_cuts_at_its_turn_markers(
    start_llama_server: Any,
) -> None:
    """The project's Gemma 3 template (the GGUF of gemma3-270m carries none) renders byte for byte as
    llama-server renders it, and a conversation's session prefix is cut before `<start_of_turn>` of its
    last user turn (Gemma's turn markers are not `<|...|>` tokens), a token prefix of the prompt. Its
    head holds nothing: the template writes the system prompt inside the first user turn."""
    from llamafleet_testbed.named_models import named_chat_template
    from llamafleet_testbed.real_models import ensure_real_model

    template_file = named_chat_template("gemma3-270m")
    assert template_file is not None and template_file.is_file()
    url = start_llama_server(ensure_real_model("gemma3-270m"), slots=1, ctx=2048,
                             extra_args=("--jinja", "--chat-template-file", str(template_file))).url
    with httpx.Client(timeout=60) as http:
        template = ChatTemplate.from_props(http.get(url + "/props").json())
        assert template.markers == ("<start_of_turn>", "<end_of_turn>")
        expected = http.post(url + "/apply-template", json=GEMMA_CONVERSATION).json()["prompt"]
        ident = chat_identity(GEMMA_CONVERSATION, template, model="gemma", block_chars=64)
        assert ident.text == expected
        cut = ident.session_prefix_chars
        assert ident.text[cut:].startswith("<start_of_turn>user\nAnd b.py?"), ident.text[cut - 40:]
        full, prefix = tokenize(http, url, ident.text), tokenize(http, url, ident.text[:cut])
        assert full[: len(prefix)] == prefix
        assert ident.shared_prefix_chars is not None and ident.shared_prefix_chars <= len("<bos>")

"""OpenAI Responses bodies (`POST /v1/responses`): what the gateway checks, refuses, and sees as chat.

llama-server serves `/v1/responses` itself: it converts the body to a chat request (server-chat.cpp),
generates, and answers in the Responses shape (`output` items, `usage` with input and output tokens;
when streaming, `response.created`, `response.output_text.delta`, ..., `response.completed`). The
router forwards the body (`normalized`) and relays the answer, as for `/v1/messages`; it converts the
body to the chat shape (`to_chat_body`, following llama-server's conversion) only to render the prompt
with the model's template, so a Responses session is routed to the slot holding its prefix like a chat
one, and to check it with the chat shapes (`shapes.py`).

What the server cannot do, or would ignore without a word, is a 400 naming it: no response is stored,
so `previous_response_id` and `conversation` cannot be continued; llama-server drops every tool that is
not a function (web search, file search, MCP...) and every input item it does not convert; it maps no
`text.format` to a grammar; it runs nothing in the `background`. Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llamafleet_router.errors import bad_request

# Fields whose any non-null value asks for what this gateway and llama-server do not do, and why.
UNSUPPORTED = {
    "previous_response_id": "responses are not stored; send the whole conversation in `input`",
    "conversation": "conversations are not stored; send the whole conversation in `input`",
    "prompt": "stored prompt templates are not supported; send `instructions` and `input`",
    "background": "background responses are not supported",
    "background_options": "background responses are not supported",
    "max_tool_calls": "llama-server cannot bound the number of tool calls",
    "context_management": "server-side context management is not supported",
    "image": "image generation is not supported",
    "access_programs": "not supported by this gateway",
}
# Input item types llama-server converts (server-chat.cpp); it refuses the others.
ITEM_TYPES = frozenset({"message", "function_call", "function_call_output", "reasoning"})
INPUT_ROLES = frozenset({"user", "system", "developer"})
_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal", "input_image": "image_url"}


def _unsupported(param: str, reason: str) -> Exception:
    return bad_request(f"`{param}`: {reason}.", param=param, code="unsupported_parameter")


def _string(value: Any, param: str) -> None:
    if type(value) is not str:
        raise bad_request(f"`{param}` must be a string.", param=param, code="invalid_type")


def check_responses_input(body: Mapping[str, Any]) -> None:
    """A 400 for a body llama-server cannot take, or takes only by ignoring part of it."""
    for name, reason in UNSUPPORTED.items():
        if body.get(name) not in (None, False, "", [], {}):
            raise _unsupported(name, reason)
    if body.get("truncation") not in (None, "disabled"):
        raise _unsupported("truncation", "only `disabled` is supported: llama-server never drops input")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (fmt is not None and (not isinstance(fmt, dict) or
                                                               fmt.get("type") != "text")):
            raise _unsupported("text.format", "only the `text` format is supported (no structured output)")
    if "input" not in body:
        raise bad_request("Missing required parameter: 'input'.", param="input",
                          code="missing_required_parameter")
    if body.get("instructions") is not None:
        _string(body["instructions"], "instructions")
    items = body["input"]
    if isinstance(items, list):
        for i, item in enumerate(items):
            _check_item(item, f"input[{i}]")
    elif type(items) is not str:
        raise bad_request("`input` must be a string or an array of items.", param="input",
                          code="invalid_type")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("`tools` must be an array.", param="tools", code="invalid_type")
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise _unsupported(f"tools[{i}]", f"only function tools are supported, not "
                                   f"{json.dumps(kind)[:40]} (llama-server has no built-in tools)")
            _string(tool.get("name"), f"tools[{i}].name")


def _check_item(item: Any, at: str) -> None:
    if type(item) is not dict:
        raise bad_request(f"`{at}` must be an object.", param=at, code="invalid_type")
    kind = item.get("type", "message")
    if kind not in ITEM_TYPES:
        raise _unsupported(f"{at}.type", f"{json.dumps(kind)[:40]} items are not supported (llama-server "
                           f"takes {', '.join(sorted(ITEM_TYPES))})")
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            _string(item.get(name), f"{at}.{name}")
    elif kind == "function_call_output":
        _string(item.get("call_id"), f"{at}.call_id")
        if not isinstance(item.get("output"), str | list):
            raise bad_request(f"`{at}.output` must be a string or an array.", param=f"{at}.output",
                              code="invalid_type")
    elif kind == "reasoning":
        content = item.get("content")
        if not (isinstance(content, list) and content and isinstance(content[0], dict)):
            raise bad_request(f"`{at}.content` must be a non-empty array.", param=f"{at}.content",
                              code="invalid_value")
        _string(content[0].get("text"), f"{at}.content[0].text")
    else:
        role = item.get("role")
        if role not in INPUT_ROLES and role != "assistant":
            raise bad_request(f"`{at}.role` must be user, system, developer or assistant.",
                              param=f"{at}.role", code="invalid_value")
        content = item.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                _check_part(part, f"{at}.content[{j}]", assistant=role == "assistant")
        elif type(content) is not str:
            raise bad_request(f"`{at}.content` must be a string or an array.", param=f"{at}.content",
                              code="invalid_type")


def _check_part(part: Any, at: str, *, assistant: bool) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    allowed = ("output_text", "input_text", "refusal") if assistant else ("input_text", "input_image")
    if kind not in allowed:
        raise bad_request(f"`{at}.type` must be one of {', '.join(allowed)}; got {json.dumps(kind)[:40]}.",
                          param=f"{at}.type", code="invalid_value")
    field = _PARTS[str(kind)]
    _string(part.get(field), f"{at}.{field}")


def normalized(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as the pod takes it: an assistant message item without `type` (the SDKs' easy input
    message) gets `type: message`, which llama-server requires of assistant items."""
    items = body.get("input")
    if not isinstance(items, list) or not any(
            isinstance(i, dict) and i.get("role") == "assistant" and "type" not in i for i in items):
        return dict(body)
    fixed = [{**i, "type": "message"} if isinstance(i, dict) and i.get("role") == "assistant"
             and "type" not in i else i for i in items]
    return {**body, "input": fixed}


def _chat_content(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": part.get("refusal", "")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
    return parts


def _last_assistant(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return messages[-1] if messages and messages[-1].get("role") == "assistant" else None


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body llama-server makes of a Responses body (checked by `check_responses_input`)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    items: list[dict[str, Any]] = [{"role": "user", "content": given}] if isinstance(given, str) else (
        given or [])
    for item in items:
        kind, previous = item.get("type", "message"), _last_assistant(messages)
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if previous is not None:
                previous.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _chat_content(output)})
        elif kind == "reasoning":
            text = item["content"][0]["text"]
            if previous is not None:
                previous["reasoning_content"] = text
            else:
                messages.append({"role": "assistant", "content": [], "reasoning_content": text})
        elif item.get("role") == "assistant" and previous is not None:
            previous.setdefault("content", []).extend(_chat_content(item.get("content")))
        else:
            messages.append({"role": item["role"], "content": _chat_content(item.get("content"))})
    chat: dict[str, Any] = {"messages": messages}
    for name in ("model", "chat_template_kwargs"):
        if name in body:
            chat[name] = body[name]
    tools = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
             for tool in body.get("tools") or [] if tool.get("type") == "function"]
    if tools:
        chat["tools"] = tools
    return chat

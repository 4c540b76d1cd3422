"""Re-build messages and tools the way llama-server does before it renders a chat template.

llama-server never hands the request JSON to the template: it parses it into C++ structs
(`common_chat_msgs_parse_oaicompat`, `common_chat_tools_parse_oaicompat` in `common/chat.cpp`) and
serialises them back (`common_chat_msg::to_json_oaicompat`), then applies per-template workarounds driven
by the template's caps. Unknown fields vanish, null content becomes "", key order is fixed, and
tool-call arguments change shape. Rendering the raw request instead would differ from the server's
prompt exactly where it matters (tools and history), so this module copies those steps.

Input the server would refuse raises `Rejected` (the caller falls back to the canonical render).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llamafleet_core.prefix.llama_json import PrecomputedJson


class Rejected(Exception):
    """llama-server would reject this input; the caller renders it canonically instead."""


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise Rejected(f"{what} must be a string")
    return value


def _compact(value: Any) -> str:
    """nlohmann `dump()`: no spaces, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _join_parts(parts: list[tuple[str, str]]) -> str:
    """`concat_content_parts`: text parts joined by newlines, none next to media markers."""
    text = ""
    last_media = False
    for kind, part in parts:
        if kind == "text":
            add_nl = not last_media and bool(text)
            last_media = False
        else:
            add_nl = False
            last_media = True
        text += ("\n" if add_nl else "") + part
    return text


def _message(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise Rejected("message is not an object")
    if "role" not in raw:
        raise Rejected("message without role")
    role = _str(raw["role"], "role")
    has_content, has_calls = "content" in raw, "tool_calls" in raw
    if role != "assistant" and not has_content:
        raise Rejected("non-assistant message without content")
    if not has_content and not has_calls:
        raise Rejected("assistant message without content or tool_calls")
    text, parts = "", []
    content = raw.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in ("text", "media_marker"):
                raise Rejected("unsupported content part")
            parts.append((str(part["type"]), _str(part.get("text"), "content part text")))
    elif content is not None:
        raise Rejected("content must be a string or an array")
    msg: dict[str, Any] = {"role": role}
    if text:
        msg["content"] = text
    elif parts:
        has_media = any(kind == "media_marker" for kind, _ in parts)
        msg["content"] = _join_parts(parts) if has_media else [{"type": k, "text": t} for k, t in parts]
    else:
        msg["content"] = ""
    for key in ("reasoning_content", "name", "tool_call_id"):
        if key in raw:
            value = _str(raw[key], key)
            if value:
                msg[key] = value
    calls = raw.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise Rejected("tool_calls must be an array")
        out = [_tool_call(call) for call in calls]
        if out:
            msg["tool_calls"] = out
    return msg


def _tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping) or call.get("type") != "function":
        raise Rejected("tool call type must be function")
    fn = call.get("function")
    if not isinstance(fn, Mapping) or "name" not in fn or "arguments" not in fn:
        raise Rejected("tool call without function name or arguments")
    args = fn["arguments"]
    out: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": _str(fn["name"], "tool name"),
            "arguments": args if isinstance(args, str) else _compact(args),
        },
    }
    if "id" in call:
        ident = _str(call["id"], "tool call id")
        if ident:
            out["id"] = ident
    return out


def normalize_messages(raw: Any, caps: Mapping[str, bool], source: str) -> list[dict[str, Any]]:
    """The `messages` variable llama-server gives the template."""
    if not isinstance(raw, list):
        raise Rejected("messages must be an array")
    msgs = [_message(m) for m in raw]
    only_string = caps.get("supports_string_content", True) and not caps.get("supports_typed_content", False)
    only_typed = caps.get("supports_typed_content", False) and not caps.get("supports_string_content", True)
    for msg in msgs:
        content = msg["content"]
        if only_string and isinstance(content, list):
            msg["content"] = _join_parts([(p["type"], p["text"]) for p in content])
        elif only_typed and isinstance(content, str):
            msg["content"] = [{"type": "text", "text": content}]
    if "<|channel|>" not in source:
        for msg in msgs:
            if msg["role"] == "developer":
                msg["role"] = "system"
    if not caps.get("supports_system_role", True) and msgs and msgs[0]["role"] == "system":
        first = msgs.pop(0)
        if msgs:
            if not isinstance(first["content"], str) or not isinstance(msgs[0]["content"], str):
                raise Rejected("cannot merge typed system content")
            msgs[0]["content"] = first["content"] + "\n" + msgs[0]["content"]
    if caps.get("supports_object_arguments", False):
        for msg in msgs:
            for call in msg.get("tool_calls", ()):
                fn = call["function"]
                if isinstance(fn["arguments"], str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError as exc:
                        raise Rejected(f"tool call arguments are not JSON: {exc}") from None
    return msgs


def normalize_tools(raw: Any) -> list[PrecomputedJson] | None:
    """The `tools` variable: None (undefined in the template) when absent or empty.

    Each tool carries its `tojson` text: templates print every tool with `tojson`, and that text is
    most of an agent prompt, so it is computed once per request and reused by every render of it.
    """
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise Rejected("tools must be an array")
    tools = []
    for tool in raw:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise Rejected("tool type must be function")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or "name" not in fn:
            raise Rejected("tool without function name")
        description = fn.get("description", "")
        params = fn.get("parameters", {})
        tools.append(PrecomputedJson({
            "type": "function",
            "function": {
                "name": _str(fn["name"], "tool name"),
                "description": _str(description, "tool description"),
                "parameters": params,
            },
        }))
    return tools or None

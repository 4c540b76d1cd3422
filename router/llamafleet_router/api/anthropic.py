"""Anthropic Messages bodies seen as OpenAI chat bodies, only to compute their prefix identity.

llama-server serves `/v1/messages` itself (it converts to its chat format internally); the router forwards
the original body. It needs the chat shape only to render the prompt with the model's template and hash
its blocks, so that a session's prefix is matched whichever API the client speaks. The conversion follows
llama-server's: `system` becomes the first message, text blocks are joined, `tool_use` blocks become
assistant `tool_calls`, `tool_result` blocks become `tool` messages, and tools get the function shape.
A mismatch only costs a routing hint: `cache_n` remains the truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", "")) for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def _message(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = message.get("role"), message.get("content")
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content)}]
    out: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            tool_calls.append({
                "id": str(block.get("id", "")),
                "type": "function",
                "function": {"name": str(block.get("name", "")),
                             "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)},
            })
        elif kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _text(block.get("content"))})
    if texts or tool_calls or not out:
        converted: dict[str, Any] = {"role": role, "content": "".join(texts)}
        if tool_calls:
            converted["tool_calls"] = tool_calls
        out.append(converted)
    return out


def chat_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Anthropic tools as OpenAI function tools (llama-server's conversion)."""
    return [
        {"type": "function", "function": {
            "name": tool.get("name", ""), "description": tool.get("description", ""),
            "parameters": tool.get("input_schema", {}),
        }}
        for tool in tools if isinstance(tool, dict)
    ]


def to_chat_body(
    body: dict[str, Any], convert_tools: Callable[[list[Any]], list[dict[str, Any]]] = chat_tools,
) -> dict[str, Any]:
    """The OpenAI chat body equivalent to an Anthropic Messages body (validated by `parse`).
    `convert_tools`: `chat_tools`, or a caller's memo of it (the same tools give the same list)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for message in body.get("messages", []):
        messages.extend(_message(message))
    chat: dict[str, Any] = {"messages": messages}
    if isinstance(body.get("model"), str):
        chat["model"] = body["model"]
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = convert_tools(tools)
    return chat

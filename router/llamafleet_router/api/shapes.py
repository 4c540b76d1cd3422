"""The shapes of messages, content parts and tools that llama-server can take, checked before scheduling.

llama-server answers a 500 (a C++ exception or its chat template's `raise_exception`, not a 400) to much
of what the OpenAI and Anthropic APIs call invalid: a content part whose `text` is not a string, an image
for a model without a vision projector (checked against the pod's `/props` by `fields.py`), a tool that
is not a function or has no name, tool-call
arguments that are not a JSON object, `chat_template_kwargs` that replace `messages`, an Anthropic
message left empty by blocks it drops (`document`, unknown types: its template then finds no user
message). The gateway refuses each of these itself, naming the place, so that bad input gets a 400
whatever the pod would do with it. What llama-server already refuses with a 400 (an unknown
`tool_choice`, a `response_format` type) is left to it.

Cheap counts come first (messages, content parts, tools), then the nesting depth of the whole body: a
250K-message body cost the event loop 1.8 s to render, and a tool schema nested 500 deep took the
encoder past Python's recursion limit. Pure functions; `ShapeError` carries the parameter's path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llamafleet_router.api.nesting import body_too_deep

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
ANTHROPIC_ROLES = frozenset({"user", "assistant"})
# OpenAI content parts llama-server converts, and the `/props` modality each needs (`fields.media_used`).
CHAT_PARTS: Mapping[str, str | None] = {"text": None, "image_url": "vision", "input_audio": "audio",
                                        "input_video": "video", "video_url": "video"}
# Anthropic blocks llama-server converts (server-chat.cpp); it drops every other type silently.
ANTHROPIC_BLOCKS = frozenset({"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"})
# Template variables llama-server sets itself: a client's `chat_template_kwargs` would replace them
# (a string for `messages`, `add_generation_prompt` that the answer's parser then does not expect: 500).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ShapeError(ValueError):
    """A body llama-server cannot take: `param` is the path of the offending value, `reason` what is
    wrong with it. The checks raise it with the path below what they were given; each caller puts its
    own part in front (`within`), so no path is formatted unless a check fails (a large agent request
    holds hundreds of messages)."""

    def __init__(self, param: str, reason: str, code: str = "invalid_value", *, message: str | None = None):
        super().__init__(param)
        self.param, self.reason, self.code, self.message = param, reason, code, message

    def __str__(self) -> str:
        return self.message or f"`{self.param}` {self.reason}"

    def within(self, prefix: str) -> ShapeError:
        return ShapeError(prefix + self.param, self.reason, self.code, message=self.message)


@dataclass(frozen=True, slots=True)
class ShapeLimits:
    max_messages: int = 10_000
    max_content_parts: int = 50_000
    max_tools: int = 512
    max_json_depth: int = 64


def check_shapes(
    body: Mapping[str, Any], *, chat: bool, anthropic: bool, limits: ShapeLimits,
    known_tools: tuple[Any, int] | None = None,
) -> None:
    """Raise ShapeError for the first thing llama-server cannot take. `parse` checked the basics
    (`messages` is a non-empty array of objects with string roles, `tools` an array). `known_tools`:
    a tools value whose depth is known (`known_tools.py`), with that depth, not walked again when it
    is the body's."""
    messages = body.get("messages") if chat or anthropic else None
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise ShapeError("messages", f"holds {len(messages)} messages; this gateway accepts at most "
                         f"{limits.max_messages}.", "too_many_messages")
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise ShapeError("tools", f"holds {len(tools)} tools; this gateway accepts at most "
                         f"{limits.max_tools}.", "too_many_tools")
    if body_too_deep(body, limits.max_json_depth, known_tools):
        raise ShapeError("body", "", "too_deep", message=f"The JSON body is nested deeper than the "
                         f"{limits.max_json_depth} levels this gateway accepts.")
    if isinstance(messages, list):
        _check_kwargs(body.get("chat_template_kwargs"))
        if anthropic:
            _anthropic_messages(messages, body.get("system"), limits.max_content_parts)
            _anthropic_tools(tools or [])
        else:
            _chat_messages(messages, limits.max_content_parts)
            _chat_tools(tools or [])


def _check_kwargs(kwargs: Any) -> None:
    if kwargs is None:
        return
    if type(kwargs) is not dict:
        raise ShapeError("chat_template_kwargs", "must be an object.", "invalid_type")
    for name in kwargs:
        if name in RESERVED_TEMPLATE_KWARGS:
            raise ShapeError(f"chat_template_kwargs.{name}", "would replace what the server gives the chat "
                             "template; set it through the request instead.")


def _string(value: Any, param: str) -> None:
    if type(value) is not str:
        raise ShapeError(param, "must be a string.", "invalid_type")


def _object(value: Any, param: str = "") -> None:
    if type(value) is not dict:
        raise ShapeError(param, "must be an object.", "invalid_type")


def _each(items: list[Any], check: Callable[[Any], None], prefix: str = "") -> None:
    """`check(item)` for every item; a failure's path gets `prefix[index]` in front."""
    for index, item in enumerate(items):
        try:
            check(item)
        except ShapeError as exc:
            raise exc.within(f"{prefix}[{index}]") from None


def _chat_messages(messages: list[Any], max_parts: int) -> None:
    parts = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is list:
            parts += len(content)
            if parts > max_parts:
                raise ShapeError(f"messages[{i}].content", "", "too_many_content_parts", message=(
                    f"The messages hold more than the {max_parts} content parts this gateway accepts."))
    _each(messages, _chat_message, "messages")
    if not any(message["role"] == "user" for message in messages):
        # The common open models' templates (Qwen's among them) raise without one: llama-server's 500.
        raise ShapeError("messages", "must contain a `user` message.")


def _chat_message(message: dict[str, Any]) -> None:
    role = message["role"]
    if role not in CHAT_ROLES:
        raise ShapeError(".role", f"must be one of {', '.join(sorted(CHAT_ROLES))}; got `{role[:40]}`.")
    content = message.get("content")
    if type(content) is list:
        _each(content, _chat_part, ".content")
    calls = message.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            raise ShapeError(".tool_calls", "must be an array.", "invalid_type")
        _each(calls, _tool_call, ".tool_calls")


def _chat_part(part: Any) -> None:
    _object(part)
    kind = part.get("type")
    if kind not in CHAT_PARTS:
        raise ShapeError(".type", f"must be one of {', '.join(CHAT_PARTS)}; got {json.dumps(kind)[:40]}.")
    if kind == "text":
        _string(part.get("text"), ".text")
        return
    media = part.get(kind)
    _object(media, f".{kind}")
    field = "data" if kind == "input_audio" or (kind == "input_video" and "url" not in media) else "url"
    _string(media.get(field), f".{kind}.{field}")


def _tool_call(call: Any) -> None:
    _object(call)
    if call.get("type", "function") != "function":
        raise ShapeError(".type", "must be `function`.")
    function = call.get("function")
    _object(function, ".function")
    _string(function.get("name"), ".function.name")
    arguments = function.get("arguments")
    if type(arguments) is str:
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    if type(arguments) is not dict:
        raise ShapeError(".function.arguments", "must be a JSON object (as text, or as is).")


def _chat_tools(tools: list[Any]) -> None:
    _each(tools, _chat_tool, "tools")


def _chat_tool(tool: Any) -> None:
    _object(tool)
    if tool.get("type") != "function":
        raise ShapeError(".type", "must be `function`: llama-server takes function tools only.")
    function = tool.get("function")
    _object(function, ".function")
    _string(function.get("name"), ".function.name")
    if function.get("parameters") is not None:
        _object(function["parameters"], ".function.parameters")


def _anthropic_messages(messages: list[Any], system: Any, max_blocks: int) -> None:
    if type(system) is list:
        _each(system, _system_block, "system")
    blocks = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is list:
            blocks += len(content)
            if blocks > max_blocks:
                raise ShapeError(f"messages[{i}].content", "", "too_many_content_parts", message=(
                    f"The messages hold more than the {max_blocks} content blocks this gateway accepts."))
            if not content and not (message["role"] == "assistant" and i == len(messages) - 1):
                raise ShapeError(f"messages[{i}].content", "must not be empty (only a final assistant "
                                 "message may be).")
    _each(messages, _anthropic_message, "messages")
    if not any(message["role"] == "user" and _asks(message.get("content")) for message in messages):
        # Tool results alone become `tool` messages: the template then finds no user message (500).
        raise ShapeError("messages", "must contain a `user` message with text or an image.")


def _system_block(block: Any) -> None:
    _object(block)
    if block.get("type") != "text":
        raise ShapeError(".type", "must be `text`.")
    _string(block.get("text"), ".text")


def _asks(content: Any) -> bool:
    return type(content) is str or any(block.get("type") in ("text", "image") for block in content)


def _anthropic_message(message: dict[str, Any]) -> None:
    role = message["role"]
    if role not in ANTHROPIC_ROLES:
        raise ShapeError(".role", f"must be `user` or `assistant`; got `{role[:40]}` (the system prompt is "
                         "the top-level `system`).")
    content = message.get("content")
    if type(content) is list:
        _each(content, _anthropic_block, ".content")
    elif type(content) is not str:
        raise ShapeError(".content", "must be a string or an array of content blocks.", "invalid_type")


def _anthropic_block(block: Any) -> None:
    _object(block)
    kind = block.get("type")
    if kind not in ANTHROPIC_BLOCKS:
        raise ShapeError(".type", f"{json.dumps(kind)[:40]} is not a content block llama-server takes (it "
                         f"takes {', '.join(sorted(ANTHROPIC_BLOCKS))}).")
    if kind in ("text", "thinking"):
        _string(block.get(kind), f".{kind}")
    elif kind == "image":
        _image_source(block.get("source"))
    elif kind == "tool_use":
        _string(block.get("id"), ".id")
        _string(block.get("name"), ".name")
        _object(block.get("input"), ".input")
    elif kind == "tool_result":
        _string(block.get("tool_use_id"), ".tool_use_id")
        result = block.get("content")
        if type(result) is list:
            _each(result, _result_block, ".content")
        elif result is not None and type(result) is not str:
            raise ShapeError(".content", "must be a string or an array of blocks.", "invalid_type")


def _result_block(block: Any) -> None:
    _object(block)
    if block.get("type") == "text":
        _string(block.get("text"), ".text")
    elif block.get("type") == "image":
        _image_source(block.get("source"))
    else:
        raise ShapeError(".type", "must be `text` or `image`.")


def _image_source(source: Any) -> None:
    _object(source, ".source")
    kind = source.get("type")
    if kind not in ("base64", "url"):
        raise ShapeError(".source.type", "must be `base64` or `url`.")
    field = "data" if kind == "base64" else "url"
    _string(source.get(field), f".source.{field}")


def _anthropic_tools(tools: list[Any]) -> None:
    _each(tools, _anthropic_tool, "tools")


def _anthropic_tool(tool: Any) -> None:
    _object(tool)
    _string(tool.get("name"), ".name")
    if tool.get("input_schema") is not None:
        _object(tool["input_schema"], ".input_schema")

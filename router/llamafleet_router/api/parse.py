"""Validation of request bodies, before anything is scheduled: every failure is an OpenAI-style 400.

Only what the router itself relies on is checked (the body is an object; `model` is a string; `stream`
is a boolean; the prompt fields exist with the right shape). Everything else is llama-server's business
and its own 4xx answers are passed through. `read_body` comes first: it refuses an oversized body (413)
by its Content-Length and, for chunked bodies, by counting, before any of it is parsed, and a body that
takes too long to arrive (408).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect

from llamafleet_router.api.embeddings import check_embeddings_input
from llamafleet_router.api.known_tools import KnownTools, ToolSpans
from llamafleet_router.api.responses import check_responses_input
from llamafleet_router.errors import ApiError, ClientGone, bad_request

if TYPE_CHECKING:
    from starlette.requests import Request


class Route(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    MESSAGES = "/v1/messages"
    COUNT_TOKENS = "/v1/messages/count_tokens"  # Anthropic's, answered by a pod without a slot
    RESPONSES = "/v1/responses"
    EMBEDDINGS = "/v1/embeddings"


#: Routes whose body is Anthropic's (their errors are Anthropic-shaped too).
ANTHROPIC_ROUTES = frozenset({Route.MESSAGES, Route.COUNT_TOKENS})
#: Routes that generate nothing: sent to a pod of the model without scheduling a slot.
DIRECT_ROUTES = frozenset({Route.COUNT_TOKENS, Route.EMBEDDINGS})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    route: Route
    body: dict[str, Any]
    model: str | None
    stream: bool
    session_id: str | None
    known_tools: KnownTools | None = None  # `body["tools"]` when its bytes were learned (known_tools.py)


def _reject_constant(name: str) -> Any:
    # NaN/Infinity are not JSON; llama-server's parser rejects them, so refuse them here with a clear 400.
    raise ValueError(f"invalid JSON constant {name}")


_UNPARSED = object()


def decode_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        # orjson is ~2x faster on a 60K-character agent request; it refuses what it cannot represent
        # (integers past 64 bits, nesting past 1024), and then the standard parser decides.
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = _UNPARSED
    try:
        if body is _UNPARSED:
            body = json.loads(raw, parse_constant=_reject_constant)
            # The standard parser accepts lone surrogates (`"\ud800"`), which no UTF-8 body can carry
            # on to the pod: refuse them here rather than fail while forwarding.
            json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise bad_request("The JSON body holds an unpaired UTF-16 surrogate escape.",
                          code="invalid_unicode") from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    return body


def parse_request(route: Route, raw: bytes, spans: ToolSpans | None = None, group: str = "") -> ParsedRequest:
    """`raw` parsed and checked for `route`; with `spans`, a `tools` value `group` sent before is
    found by its bytes, and one new to it is learned (`known_tools.py`)."""
    known = spans.parse(raw, group) if spans is not None else None
    body, known_tools = known if known is not None else (decode_json(raw), None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("`model` must be a string.", param="model", code="invalid_type")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.", param="stream", code="invalid_type")
    if route is Route.COMPLETIONS:
        _check_prompt(body)
    elif route is Route.RESPONSES:
        check_responses_input(body)
    elif route is Route.EMBEDDINGS:
        check_embeddings_input(body)
    else:
        _check_messages(body, anthropic=route in ANTHROPIC_ROUTES)
    if spans is not None and known_tools is None:
        spans.learn(raw, body, group)
    return ParsedRequest(route, body, model or None, stream, _session_id(body), known_tools)


def _check_messages(body: dict[str, Any], *, anthropic: bool) -> None:
    if "messages" not in body:
        raise bad_request("Missing required parameter: 'messages'.", param="messages",
                          code="missing_required_parameter")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_request("`messages` must be an array.", param="messages", code="invalid_type")
    if not messages:
        raise bad_request("`messages` must contain at least one message.", param="messages",
                          code="invalid_value")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"`messages[{i}]` must be an object.", param=f"messages[{i}]",
                              code="invalid_type")
        if not isinstance(message.get("role"), str):
            raise bad_request(f"`messages[{i}].role` must be a string.", param=f"messages[{i}].role",
                              code="invalid_type")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"`messages[{i}].content` must be a string or an array.",
                              param=f"messages[{i}].content", code="invalid_type")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("`tools` must be an array.", param="tools", code="invalid_type")
    if anthropic:
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise bad_request("`system` must be a string or an array.", param="system", code="invalid_type")


def _check_prompt(body: dict[str, Any]) -> None:
    if "prompt" not in body:
        raise bad_request("Missing required parameter: 'prompt'.", param="prompt",
                          code="missing_required_parameter")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt and all(
        isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool)) or isinstance(p, list)
        for p in prompt
    ):
        return
    raise bad_request("`prompt` must be a string, an array of strings or an array of token ids.",
                      param="prompt", code="invalid_type")


def _session_id(body: dict[str, Any]) -> str | None:
    """A client-chosen session key, if any (`user`, or Anthropic's `metadata.user_id`); used by the
    scheduler only as a tie-breaker, never trusted for routing correctness."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return user[:256]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        return str(metadata["user_id"])[:256]
    return None


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, refusing more than `limit` bytes by Content-Length AND by counting (chunked bodies),
    and a body still arriving `timeout_s` after the start (408: a slow-loris client holds a task and
    its buffer for as long as it likes otherwise)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ApiError(400, "Invalid Content-Length header.", code="invalid_request")
        if int(declared) > limit:
            raise _too_large(limit)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise _too_large(limit)
    except TimeoutError:
        # `connection: close`: the rest of the body may still come, and cannot be told from a request.
        raise ApiError(408, f"The request body did not arrive within {timeout_s:g} s.",
                       code="request_timeout", headers={"connection": "close"}) from None
    except ClientDisconnect:
        raise ClientGone() from None
    return bytes(body)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than the {limit} bytes this gateway accepts.",
                    code="request_too_large")

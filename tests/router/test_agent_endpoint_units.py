"""The pure parts of the endpoints agents call: Responses bodies (checks, what they become as chat),
embeddings input and pod memo, error shapes per API, model entries with their context length, and the
SSE tap on a Responses stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.access.limits import KeyLimiter, LimitConfig, PerKey
from llamafleet_router.api import responses
from llamafleet_router.api.direct import candidates
from llamafleet_router.api.embeddings import EmbeddingPods, check_embeddings_input, says_unsupported
from llamafleet_router.api.error_shapes import anthropic_type, error_body, error_event_for
from llamafleet_router.api.limited import RateLimited, admit
from llamafleet_router.api.models import context_lengths, model_entries
from llamafleet_router.api.parse import Route
from llamafleet_router.discovery.base import PodProps, PodStatus
from llamafleet_router.errors import ApiError
from llamafleet_router.proxy.sse import SSETap


def _rejects(body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        responses.check_responses_input(body)
    assert info.value.status == 400
    return info.value


def test_a_responses_body_becomes_the_chat_body_llama_server_makes_of_it() -> None:
    body = {
        "model": "m", "instructions": "Be terse.",
        "input": [
            {"role": "user", "content": "What is 2+2?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me"}]},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{\"a\":2,\"b\":2}"},
            {"type": "function_call_output", "call_id": "c1", "output": "4"},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
    }
    responses.check_responses_input(body)
    chat = responses.to_chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
        # The call joins the assistant message before it, as llama-server merges them.
        {"role": "assistant", "content": [{"type": "text", "text": "Let me"}], "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":2}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "add",
                                                                "parameters": {"type": "object"}}}]
    assert responses.to_chat_body({"input": "hi"})["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"prompt": {"id": "p"}}, "prompt"),
    ({"max_tool_calls": 3}, "max_tool_calls"),
    ({"truncation": "auto"}, "truncation"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "mcp", "server_label": "x"}]}, "tools[1]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
])
def test_what_llama_server_cannot_do_is_a_400_naming_it(extra: dict[str, Any], param: str) -> None:
    error = _rejects({"input": "hi", **extra})
    assert error.param == param, error.message
    assert error.code in ("unsupported_parameter", "invalid_value")


def test_what_llama_server_ignores_harmlessly_is_accepted() -> None:
    responses.check_responses_input({
        "input": "hi", "store": True, "background": False, "truncation": "disabled",
        "text": {"format": {"type": "text"}}, "previous_response_id": None,
        "include": ["message.output_text.logprobs"], "reasoning": {"effort": "low"}})


@pytest.mark.parametrize("body", [
    {}, {"input": 3}, {"input": [3]}, {"input": "x", "instructions": 3},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]},
    {"input": [{"role": "robot", "content": "x"}]},
])
def test_a_malformed_responses_body_is_a_400(body: dict[str, Any]) -> None:
    _rejects(body)


def test_an_easy_assistant_message_gets_the_type_llama_server_requires() -> None:
    body = {"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    assert responses.normalized(body)["input"][1] == {"role": "assistant", "content": "b", "type": "message"}
    assert responses.normalized({"input": "x"}) == {"input": "x"}


@pytest.mark.parametrize("given", ["x", ["a", "b"], [1, 2], [[1], [2, 3]]])
def test_embeddings_take_strings_and_token_ids(given: Any) -> None:
    check_embeddings_input({"input": given})


@pytest.mark.parametrize("body", [
    {}, {"input": []}, {"input": [[]]}, {"input": [-1]}, {"input": {"a": 1}}, {"input": [True]},
    {"input": "x", "dimensions": 8}, {"input": "x", "encoding_format": "int8"},
])
def test_bad_embeddings_input_is_a_400(body: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as info:
        check_embeddings_input(body)
    assert info.value.status == 400


def test_pods_without_embeddings_are_remembered_by_uid_within_a_bound() -> None:
    memo = EmbeddingPods(tracked=2)
    assert memo.serves("a")
    for uid in ("a", "b", "c"):
        memo.mark_without(uid)
    assert memo.serves("a") and not memo.serves("b") and not memo.serves("c")  # the oldest is forgotten
    refusal = b'{"error":{"code":501,"message":"This server does not support embeddings. Start it with ' \
              b'`--embeddings`","type":"not_supported_error"}}'
    assert says_unsupported(501, refusal) and not says_unsupported(400, refusal)


def _pod(uid: str, model: str | None, n_ctx: int = 0, ready: bool = True) -> PodStatus:
    endpoint = Endpoint(pod=PodRef(name=f"pod-{uid}", uid=uid, epoch=1), url=f"http://{uid}:8080",
                        model=model or "", n_slots=2, ready=ready)
    return PodStatus(endpoint, PodProps(model=model, total_slots=2, n_ctx=n_ctx) if model else None)


def test_models_report_the_smallest_context_of_their_pods() -> None:
    pods = [_pod("a", "m", 8192), _pod("b", "m", 4096), _pod("c", "n"), _pod("d", None)]
    assert context_lengths(pods) == {"m": 4096}
    entries = model_entries(pods)
    assert [e["id"] for e in entries] == ["m", "n"]
    assert entries[0]["context_length"] == entries[0]["max_model_len"] == entries[0]["meta"]["n_ctx"] == 4096
    assert "context_length" not in entries[1]  # not reported yet: no guess


def test_direct_routes_go_to_the_least_loaded_ready_pod_of_the_model() -> None:
    pods = [_pod("a", "m"), _pod("b", "m"), _pod("c", "n"), _pod("d", "m", ready=False)]
    load = {"a": 3, "b": 1}
    chosen = candidates("m", pods, lambda uid: load.get(uid, 0), lambda uid: True)
    assert [p.endpoint.uid for p in chosen] == ["b", "a"]
    assert [p.endpoint.uid for p in candidates("m", pods, load.get, lambda uid: uid != "b")] == ["a"]


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
    (500, "api_error"), (502, "api_error"), (503, "overloaded_error"),
])
def test_anthropic_errors_take_the_type_of_their_status(status: int, kind: str) -> None:
    assert anthropic_type(status) == kind
    err = ApiError(status, "no")
    for route in (Route.MESSAGES, Route.COUNT_TOKENS):
        assert error_body(err, route) == {"type": "error", "error": {"type": kind, "message": "no"}}
    assert set(error_body(err, Route.RESPONSES)) == {"error"}


def _events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    found = []
    for block in raw.strip().split(b"\n\n"):
        lines = block.decode().splitlines()
        name = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
        data = next(ln[6:] for ln in lines if ln.startswith("data: "))
        found.append((name, json.loads(data)))
    return found


def test_a_cut_stream_ends_with_the_error_event_of_its_api() -> None:
    [(name, data)] = _events(error_event_for(Route.MESSAGES)("gone"))
    assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": "gone"}}
    [(name, data)] = _events(error_event_for(Route.RESPONSES)("gone"))
    assert name == "error" and data["type"] == "error" and data["error"]["message"] == "gone"
    [(name, data)] = _events(error_event_for(Route.CHAT)("gone"))
    assert name is None and data["error"]["message"] == "gone"


def test_the_tap_ends_a_responses_stream_at_response_completed_with_its_usage() -> None:
    tap = SSETap()
    usage = {"input_tokens": 50, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 40}}
    events = [{"type": "response.created", "response": {"output": []}},
              {"type": "response.output_text.delta", "delta": "hi"},
              {"type": "response.completed", "response": {"usage": usage}}]
    tap.feed(b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events[:2]))
    assert not tap.finished
    tap.feed(f"event: response.completed\ndata: {json.dumps(events[2])}\n\n".encode())
    assert tap.finished and tap.stats is not None
    assert (tap.stats.cache_n, tap.stats.prompt_n, tap.stats.predicted_n) == (40, 10, 3)


def test_counting_tokens_and_embedding_are_charged_as_requests_not_completion_tokens() -> None:
    limiter = KeyLimiter(LimitConfig(tokens_per_minute=PerKey(10), default_tokens=1024))
    for route in (Route.COUNT_TOKENS, Route.EMBEDDINGS):
        permit = admit(limiter, "k", route, {"input": "x"})
        assert permit is not None
        permit.release()
    with pytest.raises(RateLimited) as info:  # a generation is charged its default length
        admit(limiter, "k", Route.RESPONSES, {"input": "x"})
    assert info.value.status == 429
    with pytest.raises(RateLimited):
        admit(limiter, "k", Route.RESPONSES, {"input": "x", "max_output_tokens": 11})
    assert admit(limiter, "k", Route.RESPONSES, {"input": "x", "max_output_tokens": 10}) is not None

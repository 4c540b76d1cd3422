"""Only an allow-list of fields reaches llama-server, within configured bounds (`api/fields.py`).

Unit level: the allow-list holds every field of the official SDKs (read from the installed openai SDK,
and anthropic's message params as its SDK defines them), and refuses llama-server's own fields with a
400 naming them; bounds on `n`, logprobs and lengths; `extra_fields` for every key or one key.

Through a served gateway over the fake pod (which records every body it receives): what real clients
send passes (Hermes Agent's captured request, the openai SDK's calls), every forbidden field gets a
400 naming it and reaches no pod, and no body the pod received holds a field outside the allow-list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params
from pydantic import SecretStr, ValidationError

from llamafleet_router.access.limits import PerKey
from llamafleet_router.api.fields import ALLOWED, ExtraFields, FieldPolicy, FieldRejected
from llamafleet_router.api.parse import ParsedRequest, Route, parse_request
from llamafleet_router.discovery.base import PodProps
from llamafleet_router.settings import RouterSettings
from llamafleet_testbed.hermes_layout import hermes_profile, load_layout
from tests.fuzz.fake_pod import FAKE_FIELDS
from tests.fuzz.served import API_KEY, AUTH, Served, served_gateway
from tests.security.test_bad_input_real import MODEL, POD_500

CHAT = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"model": "fake", "max_tokens": 2, "prompt": "hi"}
MESSAGES = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
BODIES = {Route.CHAT: CHAT, Route.COMPLETIONS: PROMPT, Route.MESSAGES: MESSAGES,
          Route.COUNT_TOKENS: {"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
          Route.RESPONSES: {"model": "fake", "max_output_tokens": 2, "input": "hi"},
          Route.EMBEDDINGS: {"model": "fake", "input": "hi"}}
# anthropic's MessageCreateParams (its SDK is not a dependency of this project): every body field.
ANTHROPIC_PARAMS = {
    "max_tokens", "messages", "model", "cache_control", "container", "inference_geo", "metadata",
    "output_config", "service_tier", "stop_sequences", "system", "temperature", "thinking", "tool_choice",
    "tools", "top_k", "top_p", "stream", "context_management", "mcp_servers", "output_format",
}
# What the security review saw forwarded as written (demo G2), and llama-server's other own fields.
LLAMA_ONLY = {
    "n_cmpl": 4, "n_probs": 150000, "lora": [{"id": 0, "scale": 5.0}], "n_keep": -1, "slot_id": 1,
    "t_max_predict_ms": -1, "samplers": ["dry"], "grammar": "root ::= \"x\"", "json_schema": {},
    "n_discard": 8, "n_cache_reuse": 1, "post_sampling_probs": True, "response_fields": ["x"],
    "chat_parser": "x", "chat_format": 1, "generation_prompt": "x", "preserved_tokens": ["x"],
    "grammar_triggers": [], "reasoning_budget_tokens": 5, "return_tokens": True, "verbose": True,
}


def parsed(route: Route, **fields: Any) -> ParsedRequest:
    return parse_request(route, json.dumps({**BODIES[route], **fields}).encode())


def rejected(policy: FieldPolicy, route: Route, key: str = "k", **fields: Any) -> FieldRejected:
    with pytest.raises(FieldRejected) as info:
        policy.check(parsed(route, **fields), key)
    assert info.value.status == 400
    return info.value


def test_the_allow_list_holds_every_field_of_the_official_sdks() -> None:
    chat = set(chat_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    text = set(completion_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert chat <= ALLOWED[Route.CHAT], chat - ALLOWED[Route.CHAT]
    assert text <= ALLOWED[Route.COMPLETIONS], text - ALLOWED[Route.COMPLETIONS]
    messages = ANTHROPIC_PARAMS
    assert messages <= ALLOWED[Route.MESSAGES], messages - ALLOWED[Route.MESSAGES]
    # Responses: every field is let through to `responses.py`, which refuses by name what it cannot do.
    responses = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert responses <= ALLOWED[Route.RESPONSES], responses - ALLOWED[Route.RESPONSES]
    embeddings = set(embedding_create_params.EmbeddingCreateParams.__annotations__)
    assert embeddings <= ALLOWED[Route.EMBEDDINGS], embeddings - ALLOWED[Route.EMBEDDINGS]


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("name", sorted(LLAMA_ONLY))
def test_a_llama_server_field_gets_400_naming_it(route: Route, name: str) -> None:
    error = rejected(FieldPolicy(), route, **{name: LLAMA_ONLY[name]})
    assert error.param == name and f"`{name}`" in error.message and error.code == "unknown_parameter"


def test_extra_fields_allow_more_for_every_key_or_for_one() -> None:
    policy = FieldPolicy(extra=ExtraFields.parse(["grammar", "batch:lora"]))
    assert policy.check(parsed(Route.CHAT, grammar="root ::= \"x\""), "any").body["grammar"]
    assert policy.check(parsed(Route.CHAT, lora=[]), "batch").body["lora"] == []
    assert rejected(policy, Route.CHAT, "other", lora=[]).param == "lora"
    with pytest.raises(ValueError, match="extra field"):
        ExtraFields.parse(["batch:"])
    with pytest.raises(ValidationError):
        RouterSettings(extra_fields="bad name")


def test_n_is_one_unless_allowed_and_logprobs_are_bounded() -> None:
    policy = FieldPolicy()
    for name in ("n", "best_of"):
        route = Route.COMPLETIONS if name == "best_of" else Route.CHAT
        assert rejected(policy, route, **{name: 2}).param == name
        assert policy.check(parsed(route, **{name: 1}), "k").body[name] == 1
    assert FieldPolicy(max_n=2).check(parsed(Route.CHAT, n=2), "k").body["n"] == 2
    cmpl = FieldPolicy(max_n=2, extra=ExtraFields.parse(["n_cmpl"]))  # llama-server's own name for n
    assert rejected(cmpl, Route.CHAT, n_cmpl=3).param == "n_cmpl"
    assert rejected(policy, Route.CHAT, logprobs=True, top_logprobs=21).param == "top_logprobs"
    assert rejected(policy, Route.COMPLETIONS, logprobs=150000).param == "logprobs"
    assert rejected(policy, Route.CHAT, logprobs=150000).param == "logprobs"  # llama-server's n_probs alias
    assert policy.check(parsed(Route.CHAT, logprobs=True, top_logprobs=20), "k").body["top_logprobs"] == 20
    # llama-server gives `logprobs: true` 20 alternatives by default: a lower bound is sent explicitly.
    assert FieldPolicy(max_logprobs=5).check(parsed(Route.CHAT, logprobs=True), "k").body["top_logprobs"] == 5
    assert rejected(policy, Route.CHAT, n="2").code == "invalid_type"


def test_lengths_are_lowered_to_the_keys_cap_and_sent_when_missing() -> None:
    policy = FieldPolicy(max_tokens=PerKey.parse(["100", "batch:5000", "free:0"]))
    for name in ("max_tokens", "max_completion_tokens", "n_predict"):
        assert policy.check(parsed(Route.CHAT, **{name: 1_000_000_000}), "k").body[name] == 100
        assert policy.check(parsed(Route.CHAT, **{name: 1_000_000_000}), "batch").body[name] == 5000
        assert policy.check(parsed(Route.CHAT, **{name: 50}), "k").body[name] == 50
    assert rejected(policy, Route.CHAT, n_predict=-1).param == "n_predict"  # "unlimited"
    assert rejected(policy, Route.CHAT, max_tokens=2.5).code == "invalid_type"
    assert policy.check(parsed(Route.CHAT, max_tokens=10**9), "free").body["max_tokens"] == 10**9  # 0: none
    unset = parse_request(Route.CHAT, json.dumps({"messages": CHAT["messages"]}).encode())
    assert policy.forwarded(policy.check(unset, "k"), "k", None).body["max_tokens"] == 100
    assert policy.forwarded(unset, "batch", None).body["max_tokens"] == 5000
    assert "max_tokens" not in policy.forwarded(unset, "free", None).body
    with pytest.raises(ValidationError):
        RouterSettings(max_tokens_per_request="lots")


def test_errors_on_messages_are_anthropic_shaped() -> None:
    body = rejected(FieldPolicy(), Route.MESSAGES, lora=[]).body()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "`lora`" in body["error"]["message"]
    assert "type" not in rejected(FieldPolicy(), Route.CHAT, lora=[]).body()


@pytest.mark.parametrize("name", sorted(POD_500))
def test_each_shape_llama_server_answers_500_is_refused_with_its_path(name: str) -> None:
    """The real-server cases (test_bad_input_real.py), at unit level: a 400 naming the place."""
    path, body, param = POD_500[name]
    route = Route(path)
    policy, text_only = FieldPolicy(), PodProps(model=MODEL, total_slots=1, modalities=frozenset())
    with pytest.raises(FieldRejected) as info:
        policy.forwarded(policy.check(parse_request(route, json.dumps(body).encode()), "k"), "k", text_only)
    assert info.value.param == param and f"`{param}`" in info.value.message, info.value.message


def test_counts_and_depth_are_bounded_by_the_settings() -> None:
    settings = RouterSettings(max_messages=3, max_content_parts=4, max_tools=1, max_json_depth=8)
    policy = FieldPolicy.from_settings(settings)
    user = {"role": "user", "content": [{"type": "text", "text": "x"}] * 2}
    tool = {"type": "function", "function": {"name": "f"}}
    assert policy.check(parsed(Route.CHAT, messages=[user, user], tools=[tool]), "k")
    assert rejected(policy, Route.CHAT, messages=[user] * 4).code == "too_many_messages"
    assert rejected(policy, Route.CHAT, messages=[user] * 3).code == "too_many_content_parts"
    assert rejected(policy, Route.MESSAGES, messages=[user] * 3).code == "too_many_content_parts"
    assert rejected(policy, Route.CHAT, tools=[tool, tool]).code == "too_many_tools"
    deep: Any = "x"
    for _ in range(7):  # the body, then 7 objects (the first is `metadata`'s value): 8 levels
        deep = {"a": deep}
    assert policy.check(parsed(Route.CHAT, metadata=deep), "k")
    assert rejected(policy, Route.CHAT, metadata={"a": deep}).code == "too_deep"
    assert rejected(policy, Route.COMPLETIONS, stop=[[[[[[[[["x"]]]]]]]]]).code == "too_deep"
    with pytest.raises(ValidationError):
        RouterSettings(max_json_depth=500)  # past what the encoder of forwarded bodies takes


def test_what_agents_send_passes_the_shape_checks() -> None:
    """A long tool-using conversation in both APIs, with images for a model that takes them."""
    layout = load_layout()
    body = hermes_profile(model="fake").request("fake", layout["question"], max_tokens=16)
    call = {"id": "c", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
    body["messages"] += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a b"}]},
                         {"role": "user", "content": [{"type": "text", "text": "and this?"}, {
                             "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    vision = PodProps(model="fake", total_slots=1, modalities=frozenset({"vision"}))
    policy = FieldPolicy()
    policy.forwarded(policy.check(parse_request(Route.CHAT, json.dumps(body).encode()), "k"), "k", vision)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    look = {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}}
    thought = {"type": "thinking", "thinking": "t", "signature": "s"}
    bash = {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [image]}
    claude = {"model": "fake", "max_tokens": 64000, "system": [{"type": "text", "text": "You are Claude."}],
              "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
              "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "stream": True, "messages": [
                  {"role": "user", "content": [look, image]},
                  {"role": "assistant", "content": [thought, bash]},
                  {"role": "user", "content": [result]}]}
    out = policy.forwarded(policy.check(parse_request(Route.MESSAGES, json.dumps(claude).encode()), "k"), "k",
                           vision)
    assert out.body["max_tokens"] == 32768
    with pytest.raises(FieldRejected, match="vision"):
        policy.forwarded(policy.check(parse_request(Route.MESSAGES, json.dumps(claude).encode()), "k"), "k",
                         PodProps(model="fake", total_slots=1, modalities=frozenset()))


# --- through a served gateway over the fake pod ------------------------------------------------------

KEY_2 = "second-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway(api_keys=SecretStr(f"fuzz:{API_KEY},batch:{KEY_2}"),
                        max_tokens_per_request=["32768", "batch:100000"]) as s:
        yield s


def forwarded_once(served: Served, path: str, body: dict[str, Any], headers: dict[str, str] = AUTH
                   ) -> tuple[httpx.Response, list[dict[str, Any]]]:
    before = len(served.received)
    resp = httpx.post(served.url + path, json=body, headers=headers, timeout=10)
    return resp, served.received[before:]


def assert_only_allowed(route: Route, bodies: list[dict[str, Any]]) -> None:
    for body in bodies:
        outside = set(body) - ALLOWED[route] - set(FAKE_FIELDS)
        assert not outside, (route, outside)


def test_hermes_agents_captured_request_passes_with_its_length_lowered(served: Served) -> None:
    """As Hermes sends it: streamed, `stream_options`, 18 tools and `max_tokens: 65536` (over the
    default cap of 32768, which the pod gets instead); nothing else of the body changes."""
    layout = load_layout()
    body = hermes_profile(model="fake").request("fake", layout["question"], max_tokens=layout["max_tokens"])
    assert body["max_tokens"] == 65536 and len(body["tools"]) == 18
    resp, got = forwarded_once(served, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    assert len(got) == 1 and got[0]["max_tokens"] == 32768
    assert {k: v for k, v in got[0].items() if k not in ("max_tokens", "id_slot", "cache_prompt")} == {
        k: v for k, v in body.items() if k != "max_tokens"}
    assert_only_allowed(Route.CHAT, got)
    resp, got = forwarded_once(served, "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY_2}"})
    assert resp.status_code == 200 and got[0]["max_tokens"] == 65536  # the batch key's own cap: 100000


def test_the_openai_sdk_passes_with_its_common_fields(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0)
    before = len(served.received)
    chat = client.chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=8, temperature=0.2, top_p=0.9, seed=3, stop=["\n"], user="u1",
        presence_penalty=0.1, frequency_penalty=0.1, logit_bias={"1": -1}, logprobs=True, top_logprobs=2,
        n=1, parallel_tool_calls=True, tool_choice="auto", response_format={"type": "text"},
        metadata={"a": "b"}, store=False, reasoning_effort="low", service_tier="auto",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        extra_body={"top_k": 40, "min_p": 0.05, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert chat.http_response.status_code == 200
    text = client.completions.with_raw_response.create(model="fake", prompt="hi", max_tokens=4, echo=False,
                                                       logprobs=2, suffix=None, best_of=1)
    assert text.http_response.status_code == 200
    assert_only_allowed(Route.CHAT, served.received[before:before + 1])
    assert_only_allowed(Route.COMPLETIONS, served.received[before + 1:])


@pytest.mark.parametrize(("route", "base"), [("/v1/chat/completions", CHAT), ("/v1/completions", PROMPT),
                                             ("/v1/messages", MESSAGES)])
def test_forbidden_fields_get_400_naming_them_and_reach_no_pod(
    served: Served, route: str, base: dict[str, Any],
) -> None:
    cases: dict[str, Any] = {**LLAMA_ONLY, "n": 4, "max_tokens": -1, "top_logprobs": 150000}
    for name, value in cases.items():
        resp, got = forwarded_once(served, route, {**base, name: value})
        assert resp.status_code == 400, (route, name, resp.text)
        assert f"`{name}`" in resp.json()["error"]["message"], (name, resp.text)
        assert got == [], (route, name)


def test_a_body_with_no_length_is_sent_with_the_keys_cap(served: Served) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    resp, got = forwarded_once(served, "/v1/chat/completions", body)
    assert resp.status_code == 200 and got[0]["max_tokens"] == 32768
    resp, got = forwarded_once(served, "/v1/messages", body, {"x-api-key": KEY_2})
    assert resp.status_code == 200 and got[0]["max_tokens"] == 100000
    assert served.leaks() == (0, 0)

"""The official `openai` SDK against `llamafleet up` (real llama-server, agent, Redis, gateway): chat
completions streamed and not, tools and a tool call's round trip, usage with cached tokens, and the gateway's
errors as the SDK's exception classes. Greedy and a few tokens each: the model is tiny and random, so
the checks are on shapes, counts and the SDK's own types, never on the text's meaning.
"""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
)
from openai.types.chat.chat_completion_message_tool_call import Function

from tests.local.sdk_bed import MODEL, assert_no_client_errors, openai_client
from tests.local.up_bed import Up

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SYSTEM = " ".join(f"Rule {i}: answer in one short line and name files by their path." for i in range(40))
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}


def test_chat_completions_streamed_and_not(sdk_up: Up) -> None:
    """A plain and a streamed completion of one prompt parse into the SDK's types; the stream's
    chunks carry the same text as the plain answer (greedy), and its last chunk the usage. (Thinking is
    off, which the tiny model's template would start with, so that the text is the answer's content.)"""
    client = openai_client(sdk_up, "chat")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                           extra_body=NO_THINKING)
    assert isinstance(plain, ChatCompletion) and plain.object == "chat.completion"
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("length", "stop")
    assert plain.usage is not None and 1 <= plain.usage.completion_tokens <= 8

    assert choice.message.content

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=NO_THINKING))
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens
    assert_no_client_errors(sdk_up, "chat", answered=2)


def test_usage_reports_the_cached_prefix(sdk_up: Up) -> None:
    """A second request sharing the first's long system prompt reports most of it as cached
    (`usage.prompt_tokens_details.cached_tokens`), as OpenAI's prompt caching does."""
    client = openai_client(sdk_up, "cache")
    first = client.chat.completions.create(
        model=MODEL, max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "First question?"}])
    second = client.chat.completions.create(
        model=MODEL, max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Second question?"}])
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= first.usage.prompt_tokens // 2, second.usage
    assert details.cached_tokens < second.usage.prompt_tokens
    assert_no_client_errors(sdk_up, "cache", answered=2)


def test_tools_and_a_tool_call_round_trip(sdk_up: Up) -> None:
    """Requests with tools, `tool_choice` auto and required, streamed and not, are answered in the SDK's
    types; a conversation holding an assistant tool call (built with the SDK's own types) and its
    `tool` result is rendered and answered, its prompt longer by the call and the result.

    A parsed tool call in the answer is not checked: this llama-server's grammar for a required call
    (`peg-native`) lets free text come first, which a random model never ends within a few tokens."""
    client = openai_client(sdk_up, "tools")
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    auto = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], max_tokens=8,
                                          temperature=0)
    assert isinstance(auto, ChatCompletion) and auto.choices[0].message.role == "assistant"
    required = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], max_tokens=8,
                                              temperature=0, tool_choice="required")
    assert required.choices[0].finish_reason in ("length", "stop", "tool_calls")
    streamed = list(client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], max_tokens=8,
                                                   temperature=0, tool_choice="required", stream=True))
    assert streamed and all(isinstance(c, ChatCompletionChunk) for c in streamed)

    function = Function(name="get_weather", arguments='{"unit": "celsius"}')
    call = ChatCompletionMessageToolCall(id="call_1", type="function", function=function)
    said = ChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
    history = [*ask, said.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8,
                                            temperature=0)
    assert answer.choices[0].message.role == "assistant" and answer.usage is not None
    assert auto.usage is not None and answer.usage.prompt_tokens > auto.usage.prompt_tokens + 10
    assert_no_client_errors(sdk_up, "tools", answered=4)


def test_errors_are_the_sdks_exception_classes(sdk_up: Up) -> None:
    """A wrong key is an AuthenticationError (401), streamed or not; a field the gateway does not
    forward and an empty `messages` are BadRequestErrors (400) naming the problem; an unknown model is
    a NotFoundError (404)."""
    messages = [{"role": "user", "content": "Hi"}]
    wrong = openai_client(sdk_up, "errors", key="sk-not-a-key")
    with pytest.raises(openai.AuthenticationError) as denied:
        wrong.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert denied.value.status_code == 401 and "sk-not-a-key" not in str(denied.value)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, stream=True)

    client = openai_client(sdk_up, "errors")
    with pytest.raises(openai.BadRequestError) as field:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                       extra_body={"grammar": "root ::= \"x\""})
    assert field.value.status_code == 400 and "grammar" in field.value.message
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert "messages" in empty.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    assert unknown.value.status_code == 404 and "no-such-model" in unknown.value.message

"""The official `anthropic` SDK against `llamafleet up`: messages streamed and not, usage with the cached
prefix (`cache_read_input_tokens`), tools and a tool use's round trip, and the gateway's errors as the
SDK's exception classes. Greedy and a few tokens each, on the tiny random model: shapes, counts and
types, not meaning.
"""

from __future__ import annotations

import anthropic
import pytest
from anthropic.types import Message, TextBlock, ThinkingBlock, ToolUseBlock

from tests.local.sdk_bed import MODEL, anthropic_client, assert_no_client_errors
from tests.local.up_bed import Up

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SYSTEM = " ".join(f"Clause {i}: reply in one line, cite sources, never invent figures." for i in range(40))
#: Recent SDKs take no `temperature` argument: it goes as an extra body field, which the gateway forwards.
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    },
}


def _blocks(message: Message) -> list[tuple[str, str]]:
    """(type, text) of each content block: a thinking block's thinking, a text block's text."""
    return [(b.type, b.text if isinstance(b, TextBlock) else getattr(b, "thinking", ""))
            for b in message.content]


def test_messages_streamed_and_not_with_the_cached_prefix(sdk_up: Up) -> None:
    """A message and a streamed message of one prompt parse into the SDK's types with the same blocks
    (greedy: thinking, then text); the second, sharing the first's long system prompt, reads most of it
    from the cache."""
    client = anthropic_client(sdk_up, "messages")
    ask = [{"role": "user", "content": "Say hello."}]
    plain = client.messages.create(model=MODEL, system=SYSTEM, messages=ask, max_tokens=8, extra_body=GREEDY)
    assert isinstance(plain, Message) and plain.role == "assistant" and plain.type == "message"
    assert plain.stop_reason in ("max_tokens", "end_turn")
    # The tiny model's template thinks first: a thinking block, then text.
    assert plain.content and all(isinstance(b, TextBlock | ThinkingBlock) for b in plain.content)
    assert 1 <= plain.usage.output_tokens <= 8 and plain.usage.input_tokens > 0

    with client.messages.stream(model=MODEL, system=SYSTEM, messages=ask, max_tokens=8,
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(plain)
    assert text == "".join(b.text for b in plain.content if isinstance(b, TextBlock))
    assert final.usage.output_tokens == plain.usage.output_tokens
    cached = final.usage.cache_read_input_tokens
    total = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    assert cached is not None and total // 2 <= cached < total, final.usage
    assert_no_client_errors(sdk_up, "messages", answered=2)


def test_tools_and_a_tool_use_round_trip(sdk_up: Up) -> None:
    """Messages with tools, `tool_choice` auto and any, are answered as the SDK's `Message`; a
    conversation holding a `tool_use` block (the SDK's own type) and its `tool_result` is rendered
    and answered, its prompt longer by them. (No parsed tool use in an answer: see the OpenAI test.)"""
    client = anthropic_client(sdk_up, "tool-use")
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    auto = client.messages.create(model=MODEL, messages=ask, tools=[WEATHER], max_tokens=8, extra_body=GREEDY)
    anyone = client.messages.create(model=MODEL, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
                                    max_tokens=8, extra_body=GREEDY)
    assert isinstance(auto, Message) and isinstance(anyone, Message) and anyone.usage.output_tokens >= 1

    use = ToolUseBlock(type="tool_use", id="toolu_1", name="get_weather", input={"unit": "celsius"})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}
    history = [*ask, {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
               {"role": "user", "content": [result]}]
    answer = client.messages.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8,
                                    extra_body=GREEDY)
    assert isinstance(answer, Message) and answer.usage.output_tokens >= 1
    given = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)  # input excludes cached
    assert given > auto.usage.input_tokens + (auto.usage.cache_read_input_tokens or 0) + 10
    assert_no_client_errors(sdk_up, "tool-use", answered=3)


def test_errors_are_the_sdks_exception_classes(sdk_up: Up) -> None:
    """A wrong key is an AuthenticationError (401), streamed or not; a field the gateway does not
    forward is a BadRequestError (400) naming it; an unknown model is a NotFoundError (404)."""
    ask = [{"role": "user", "content": "Hi"}]
    wrong = anthropic_client(sdk_up, "errors", key="sk-not-a-key")
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model=MODEL, messages=ask, max_tokens=2)
    assert denied.value.status_code == 401 and "sk-not-a-key" not in str(denied.value)
    with pytest.raises(anthropic.AuthenticationError), \
            wrong.messages.stream(model=MODEL, messages=ask, max_tokens=2) as stream:
        stream.get_final_message()

    client = anthropic_client(sdk_up, "errors")
    with pytest.raises(anthropic.BadRequestError) as field:
        client.messages.create(model=MODEL, messages=ask, max_tokens=2, extra_body={"n_probs": 3})
    assert field.value.status_code == 400 and "n_probs" in field.value.message
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", messages=ask, max_tokens=2)
    assert unknown.value.status_code == 404 and "no-such-model" in unknown.value.message

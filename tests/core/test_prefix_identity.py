"""Session-prefix cut and identities: the cut is a special-token start before the last user message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.prefix import (
    PromptError,
    chat_identity,
    common_blocks,
    completion_identity,
    special_token_start,
)
from llamafleet_core.prefix.identity import first_message_end
from tests.fixtures.templates import TOOLS_AFTER, TOOLS_FIRST, Templates

TOOLS = [
    {"type": "function", "function": {"name": f"t{i}", "description": "d" * 300,
                                      "parameters": {"type": "object", "properties": {}}}}
    for i in range(3)
]
TEMPLATES = Templates(TOOLS_FIRST, TOOLS_AFTER)


def history(last_user: str, *, tools: bool = True, turns: int = 2, tail_tool: bool = False) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 40}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"question {t}"})
        msgs.append({"role": "assistant", "content": "", "reasoning_content": f"thinking {t}", "tool_calls": [
            {"id": f"c{t}", "type": "function", "function": {"name": "t1", "arguments": '{"a": 1}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"result {t}"})
        msgs.append({"role": "assistant", "content": f"answer {t}"})
    msgs.append({"role": "user", "content": last_user})
    if tail_tool:
        msgs.append({"role": "assistant", "tool_calls": [
            {"id": "z", "type": "function", "function": {"name": "t2", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": "z", "content": "late result"})
    body: dict[str, Any] = {"model": "m", "messages": msgs}
    if tools:
        body["tools"] = TOOLS
    return body


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("turns", [0, 2])
@pytest.mark.parametrize("tools", [True, False])
def test_cut_lands_on_the_last_user_turn_marker(name: str, turns: int, tools: bool) -> None:
    """The session prefix ends right before `<|im_start|>user` of the last user message."""
    ident = chat_identity(history("the last question", tools=tools, turns=turns), TEMPLATES[name], model="m")
    assert ident.rendered_by == "template"
    assert ident.text[ident.session_prefix_chars:].startswith("<|im_start|>user\nthe last question<|im_end|>")


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
def test_sessions_share_the_session_prefix_when_only_the_last_user_message_differs(name: str) -> None:
    a = chat_identity(history("first session", turns=1), TEMPLATES[name], model="m", block_chars=64)
    b = chat_identity(history("another one", turns=1), TEMPLATES[name], model="m", block_chars=64)
    assert a.session_prefix_chars == b.session_prefix_chars
    assert a.text[: a.session_prefix_chars] == b.text[: b.session_prefix_chars]
    assert common_blocks(a.blocks, b.blocks) == len(a.session_blocks) == a.session_prefix_chars // 64
    assert a.blocks[: len(a.session_blocks)] == a.session_blocks


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("tools", [True, False])
def test_shared_prefix_ends_before_the_first_user_message_when_the_conversation_has_history(
    name: str, tools: bool
) -> None:
    """Every session of an agent shares tools and system prompt, not its history: the shared cut of a
    later turn is the session cut of a first turn with the same head, and lies before the history."""
    later = chat_identity(history("the next question", tools=tools, turns=2), TEMPLATES[name], model="m")
    first = chat_identity(history("question 0", tools=tools, turns=0), TEMPLATES[name], model="m")
    assert first.shared_chars == first.session_prefix_chars
    assert later.shared_chars == first.session_prefix_chars < later.session_prefix_chars
    assert later.text[: later.shared_chars] == first.text[: first.session_prefix_chars]
    assert later.text[later.shared_chars:].startswith("<|im_start|>user\nquestion 0")


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("block_chars", [16, 64, 256])
def test_every_turn_of_a_conversation_carries_its_tag_and_other_sessions_do_not(
    name: str, block_chars: int
) -> None:
    """The tag covers the head plus the first question exactly: a later turn of the same conversation
    has it, another question or another head does not (even when they differ inside the last block)."""
    def tag(body: dict[str, Any]) -> str | None:
        return chat_identity(body, TEMPLATES[name], model="m", block_chars=block_chars).conversation_tag

    first = tag(history("question 0", turns=0))
    assert first is not None
    assert tag(history("the next question", turns=2)) == first  # its first user message is "question 0"
    assert tag(history("question 1", turns=0)) != first
    assert tag(history("question 0!", turns=0)) != first  # one character more, inside the last block
    assert tag(history("question 0", tools=False, turns=0)) != first
    assert chat_identity(history("question 0", turns=0), TEMPLATES[name], model="other",
                         block_chars=block_chars).conversation_tag != first


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
def test_the_head_tag_names_the_exact_text_before_the_first_user_message(name: str) -> None:
    """Every session and turn with the same tools and system prompt has the head tag; a system prompt
    differing in its last characters (inside the head's last block) does not."""
    def ident(body: dict[str, Any]) -> Any:
        return chat_identity(body, TEMPLATES[name], model="m")

    first = ident(history("question 0", turns=0))
    assert first.head_tag is not None
    assert first.tags.head == first.head_tag and first.tags.head_blocks == first.shared_chars // 256
    assert ident(history("another", turns=0)).head_tag == first.head_tag
    assert ident(history("later", turns=2)).head_tag == first.head_tag
    other_day = history("question 0", turns=0)
    other_day["messages"][0]["content"] += "Today is Tuesday."
    assert ident(other_day).head_tag != first.head_tag
    assert completion_identity({"prompt": "hello"}, model="m").head_tag is None


def test_no_conversation_tag_without_a_template_render_or_a_user_message() -> None:
    assert chat_identity(history("q", turns=0), None, model="m").conversation_tag is None
    system_only = {"messages": [{"role": "system", "content": "s"}]}
    assert chat_identity(system_only, None, model="m").conversation_tag is None
    assert completion_identity({"prompt": "hello"}, model="m").conversation_tag is None


def test_first_message_end_finds_the_marker_after_the_opening_one() -> None:
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    start = text.index("<|im_start|>user")
    assert text[: first_message_end(text, start)].endswith("user\nQ")
    markers = ["<|im_start|>", "<|im_end|>"]
    assert first_message_end(text, start, markers=markers) == text.index("<|im_end|>", start)
    assert first_message_end("<|im_start|>user\nno end", 0) == 0
    assert first_message_end("plain text", 0) == 0
    assert first_message_end("[INST] q [/INST]", 0, markers=["<|x|>"]) == 0


def test_shared_prefix_is_the_session_prefix_in_the_fallback_render_of_a_first_turn() -> None:
    ident = chat_identity(history("q", turns=0), None, model="m")
    assert ident.shared_chars == ident.session_prefix_chars
    later = chat_identity(history("q", turns=1), None, model="m")
    assert later.shared_chars == ident.session_prefix_chars < later.session_prefix_chars


@pytest.mark.models
@pytest.mark.parametrize("name", TEMPLATES)
def test_cut_stays_before_the_last_user_message_when_tool_turns_follow_it(name: str) -> None:
    ident = chat_identity(history("do it", tail_tool=True), TEMPLATES[name], model="m")
    rest = ident.text[ident.session_prefix_chars:]
    assert rest.startswith("<|im_start|>user\ndo it<|im_end|>") and "late result" in rest


@pytest.mark.models
def test_cut_falls_on_a_marker_when_the_template_renders_the_history_differently() -> None:
    """Qwen3.5 adds `<think>` blocks to assistant turns after the last query; the cut is still the
    last user message's marker because the probe keeps a user turn at the end."""
    ident = chat_identity(history("q", turns=2), TEMPLATES["Qwen3.5-4B.jinja"], model="m")
    assert ident.text[ident.session_prefix_chars:].startswith("<|im_start|>user\nq<|im_end|>")
    assert "<think>\nthinking 1" not in ident.text[: ident.session_prefix_chars]


def test_fallback_identity_cuts_at_the_canonical_user_marker_when_no_template() -> None:
    ident = chat_identity(history("q", turns=1), None, model="m")
    assert ident.rendered_by == "fallback"
    assert ident.text[ident.session_prefix_chars:] == "<|user|>\nq\n<|assistant|>\n"


def test_whole_prompt_is_the_session_prefix_when_there_is_no_user_message() -> None:
    ident = chat_identity({"messages": [{"role": "system", "content": "S"}]}, None, model="m")
    assert ident.session_prefix_chars == len(ident.text)


def test_special_token_start_backs_off_to_the_marker_at_or_before_the_position() -> None:
    text = "<|a|>hello <| not |> x<|im_start|>user"
    assert special_token_start(text, text.index("user")) == text.index("<|im_start|>")
    assert special_token_start(text, text.index("<|im_start|>")) == text.index("<|im_start|>")
    assert special_token_start(text, text.index("x")) == 0
    assert special_token_start("no markers", 5) == 0
    assert special_token_start("ab[INST]cd[INST]", 12, markers=["[INST]"]) == 10
    assert special_token_start("ab[INST]cd[INST]", 9, markers=["[INST]"]) == 2


@pytest.mark.models
def test_models_never_share_blocks_when_prompts_are_equal() -> None:
    body = history("q")
    a = chat_identity(body, TEMPLATES["Qwen-Qwen3-0.6B.jinja"], model="a")
    b = chat_identity(body, TEMPLATES["Qwen-Qwen3-0.6B.jinja"], model="b")
    assert a.text == b.text and common_blocks(a.blocks, b.blocks) == 0


def test_completion_identity_hashes_a_string_prompt_as_is() -> None:
    ident = completion_identity({"prompt": "x" * 600}, model="m")
    got = (ident.rendered_by, ident.text, len(ident.blocks), ident.session_prefix_chars)
    assert got == ("raw", "x" * 600, 2, 600)


def test_completion_identity_serialises_token_prompts_canonically() -> None:
    a = completion_identity({"prompt": [1, 2, 3]}, model="m")
    b = completion_identity({"prompt": [1, 2, 3]}, model="m")
    assert a.rendered_by == "fallback" and a.text == b.text and "[1,2,3]" in a.text


@pytest.mark.models
@pytest.mark.parametrize("body", [None, [], "x", {}, {"messages": None}, {"messages": {"role": "user"}}])
def test_prompt_error_is_raised_when_there_are_no_messages(body: Any) -> None:
    with pytest.raises(PromptError):
        chat_identity(body, TEMPLATES["Qwen3.5-4B.jinja"], model="m")


def test_prompt_error_is_raised_when_completion_has_no_prompt() -> None:
    with pytest.raises(PromptError):
        completion_identity({"messages": []}, model="m")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["role", "content", "tool_calls", "type", "function", "name", "arguments", "text"]),
        inner, max_size=5),
    max_leaves=25,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", 7])},
    optional={"content": json_values, "tool_calls": json_values, "reasoning_content": json_values},
)
bodies = st.fixed_dictionaries(
    {"messages": st.lists(message | json_values, max_size=5)},
    optional={"tools": json_values, "chat_template_kwargs": json_values},
) | json_values


@pytest.mark.models
@settings(max_examples=150, deadline=None)
@given(bodies, st.sampled_from(list(TEMPLATES)))
def test_any_json_body_gives_an_identity_or_prompt_error(body: Any, name: str) -> None:
    """Invalid input is the caller's problem, but it never crashes the gateway."""
    try:
        ident = chat_identity(body, TEMPLATES[name], model="m", block_chars=16)
    except PromptError:
        return
    assert 0 <= ident.session_prefix_chars <= len(ident.text)
    assert len(ident.blocks) == len(ident.text) // 16
    again = chat_identity(body, TEMPLATES[name], model="m", block_chars=16)
    assert (again.text, again.session_prefix_chars) == (ident.text, ident.session_prefix_chars)

"""The fast full prompt (the shape's cached render with the question put in) equals a whole render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.prefix import ChatTemplate, TemplateCache, chat_identity, render_chat, template_cache
from llamafleet_core.prefix.substitute import plain_text, substituted
from llamafleet_testbed.llama_build import source_dir
from tests.core.test_prefix_identity import history
from tests.fixtures.templates import TOOLS_AFTER, TOOLS_FIRST, Templates

TEMPLATES = Templates(TOOLS_FIRST, TOOLS_AFTER)
FIELDS = ("text", "blocks", "session_prefix_chars", "shared_prefix_chars", "head_tag", "conversation_tag",
          "rendered_by")
QUESTIONS = ["the last question", "what is 2+2? Answer: 4", "multi\nline\ttext here", "ünïcödé ✓ 日本",
             "  padded  ", "<tool_response>x</tool_response>", "a [b] c", "x", "{{ not jinja }}",
             "\"quoted\" & 'single' \\ back", "", "\x01aZ\"'\\&<>{}"]


def template_files() -> list[Path]:
    try:
        return sorted((source_dir() / "models" / "templates").glob("*.jinja"))
    except Exception:  # no sdist on this machine: the tests below are `models` and skip at collection
        return []


def same(a: Any, b: Any) -> list[str]:
    return [f for f in FIELDS if getattr(a, f) != getattr(b, f)]


def last_user(body: dict[str, Any]) -> int:
    return max(i for i, m in enumerate(body["messages"]) if m.get("role") == "user")


@pytest.mark.models
def test_every_template_of_llama_cpp_gives_the_whole_render_s_identity() -> None:
    """All of llama.cpp's templates, first turns and later ones, with and without tools, plain questions
    and ones that trim, inspect or escape: the fast path gives exactly the identity of a whole render,
    and it is taken for most templates (else this test would prove nothing)."""
    files = template_files()
    assert len(files) > 40
    fast_in: set[str] = set()
    wrong: list[tuple[str, int, bool, str, list[str]]] = []
    for path in files:
        template = ChatTemplate(source=path.read_text())
        for turns in (0, 1):
            for tools in (True, False):
                for question in QUESTIONS:
                    body = history(question, tools=tools, turns=turns)
                    fast = chat_identity(body, template, model="m", block_chars=64)
                    whole = chat_identity(body, template, model="m", block_chars=64, substitute=False)
                    if diff := same(fast, whole):
                        wrong.append((path.name, turns, tools, question, diff))
                    if substituted(template, body, body["messages"], last_user(body)) is not None:
                        fast_in.add(path.name)
    assert not wrong
    assert len(fast_in) > len(files) * 2 // 3
    assert {TOOLS_FIRST, TOOLS_AFTER, "llama-cpp-deepseek-r1.jinja"} <= fast_in


@pytest.mark.models
@settings(max_examples=120, deadline=None)
@given(st.text(max_size=40), st.sampled_from(list(TEMPLATES)), st.integers(0, 2))
def test_any_question_gives_the_whole_render_s_identity(question: str, name: str, turns: int) -> None:
    body = history(question, turns=turns)
    fast = chat_identity(body, TEMPLATES[name], model="m", block_chars=32)
    assert not same(fast, chat_identity(body, TEMPLATES[name], model="m", block_chars=32, substitute=False))


def test_plain_text_excludes_what_templates_branch_on_or_trim() -> None:
    assert plain_text("What is the capital of France? And of Spain.")
    assert plain_text("two\nlines")
    for text in ("", " lead", "trail\n", "<tool_response>", "see [TOOL_RESULTS]", 7, None, [{"text": "a"}]):
        assert not plain_text(text)


CHAT = ("{% for m in messages %}<|{{ m.role }}|>{FILL}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("fill,taken", [
    ("{{ m.content }}", True),
    ("{{ m.content | trim }}", True),  # the text qualifies only without whitespace at its ends
    ("{{ m.content | upper }}", False),
    ("{{ m.content | tojson }}", False),
    ("{{ m.content | e }}", False),
    ("{{ m.content }}{{ m.content }}", False),
    ("{{ m.content | length }}", False),
    ("{{ m.content | lstrip }}", False),
    ("{% if m.content | length > 3 %}long{% endif %}{{ m.content }}", False),
])
def test_the_shape_check_refuses_templates_that_change_the_text(fill: str, taken: bool) -> None:
    """A refused shape renders the whole prompt: the identity is right either way."""
    template = ChatTemplate(source=CHAT.replace("{FILL}", fill))
    body = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                         {"role": "user", "content": "why so"}]}
    assert (substituted(template, body, body["messages"], 2) is not None) is taken
    fast = chat_identity(body, template, model="m", block_chars=8)
    assert not same(fast, chat_identity(body, template, model="m", block_chars=8, substitute=False))
    assert fast.text == render_chat(template, body).text


def test_a_new_question_of_a_seen_shape_renders_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape is rendered (and checked) once; later questions are served from the render cache."""
    cache = TemplateCache()
    template = ChatTemplate(source=CHAT.replace("{FILL}", "{{ m.content | trim }}"), cache=cache)

    def body(question: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                             {"role": "user", "content": question}]}

    chat_identity(body("first"), template, model="m")
    compiled = cache.compile(template.source)
    renders: list[object] = []
    render = template_cache.render_without_cycles

    def counted(tmpl: Any, context: dict[str, Any]) -> str:
        if tmpl is compiled:
            renders.append(context)
        return render(tmpl, context)

    monkeypatch.setattr(template_cache, "render_without_cycles", counted)
    for question in ("second", "third one", "and a fourth"):
        ident = chat_identity(body(question), template, model="m")
        assert ident.text.endswith(f"<|user|>{question}<|end|><|assistant|>")
    assert renders == []
    chat_identity(body(" padded "), template, model="m", substitute=False)
    assert renders  # the whole render does call the template

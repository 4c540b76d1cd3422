"""Local rendering follows llama-server's rules: input normalisation, llama.cpp's tojson, fallbacks."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
from jinja2 import TemplateError

from llamafleet_core.prefix.jinja_env import render_without_cycles
from llamafleet_core.prefix.llama_json import llama_str, llama_tojson
from llamafleet_core.prefix.normalize import normalize_tools
from llamafleet_core.prefix.template import ChatTemplate, _build_context, canonical_render, render_chat
from llamafleet_core.prefix.template_cache import TemplateCache
from llamafleet_testbed.llama_build import source_dir

# What llama-server reports in /props `chat_template_caps` for these templates.
QWEN35_CAPS = {"supports_string_content": True, "supports_typed_content": True, "supports_system_role": True,
               "supports_tool_calls": True, "supports_object_arguments": True}
QWEN3_CAPS = {"supports_string_content": True, "supports_typed_content": False, "supports_system_role": True,
              "supports_tool_calls": True, "supports_object_arguments": True}

TOOL = {"type": "function", "function": {
    "name": "read", "description": "Read a file", "strict": True,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
TOOL_JSON = ('{"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": '
             '{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}')


def load(name: str, caps: dict[str, bool] | None = None, **kw: Any) -> ChatTemplate:
    return ChatTemplate(source=(source_dir() / "models" / "templates" / name).read_text(), caps=caps, **kw)


@pytest.fixture(scope="module")
def qwen3() -> ChatTemplate:
    return load("Qwen-Qwen3-0.6B.jinja", QWEN3_CAPS)


@pytest.fixture(scope="module")
def qwen35() -> ChatTemplate:
    return load("Qwen3.5-4B.jinja", QWEN35_CAPS)


def test_tojson_uses_llama_separators_and_keeps_unicode_and_key_order() -> None:
    assert llama_tojson({"b": 1, "a": [True, None, "é\n"]}) == '{"b": 1, "a": [true, null, "é\\n"]}'


def test_tojson_prints_floats_like_a_cpp_stream() -> None:
    assert llama_tojson([1.0, 0.1, 0.1234567, 1e-7, 2.5e20]) == "[1, 0.1, 0.123457, 1e-07, 2.5e+20]"


def test_tojson_honours_ensure_ascii_indent_and_separators() -> None:
    assert llama_tojson({"k": "é"}, ensure_ascii=True) == '{"k": "\\u00e9"}'
    assert llama_tojson({"k": [1]}, indent=2) == '{\n  "k": [\n    1\n  ]\n}'
    assert llama_tojson({"k": 1, "j": 2}, separators=[",", ":"]) == '{"k":1,"j":2}'


def test_output_and_string_filter_print_python_style_scalars() -> None:
    assert [llama_str(v) for v in (True, False, 2, 1.5, 2.0)] == ["True", "False", "2", "1.5", "2.0"]
    assert llama_str({"a": "x", "b": [1]}) == "{'a': 'x', 'b': [1]}"


@pytest.mark.models
def test_plain_chat_renders_chatml_when_no_tools(qwen3: ChatTemplate) -> None:
    body = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]}
    r = render_chat(qwen3, body)
    assert r.path == "template"
    assert r.text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n")


@pytest.mark.models
def test_generation_prompt_opens_think_block_when_thinking_on(qwen35: ChatTemplate) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert render_chat(qwen35, body).text == expected
    body["chat_template_kwargs"] = {"enable_thinking": False}
    assert render_chat(qwen35, body).text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.models
def test_tools_are_rebuilt_without_unknown_fields_when_rendered(qwen3: ChatTemplate) -> None:
    """llama-server keeps only name, description and parameters of each tool (so `strict` vanishes)."""
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    body = {"messages": msgs, "tools": [TOOL]}
    text = render_chat(qwen3, body).text
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert f"<tools>\n{TOOL_JSON}\n</tools>" in text


@pytest.mark.models
def test_empty_tool_list_renders_like_no_tools(qwen35: ChatTemplate) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    with_empty = render_chat(qwen35, {"messages": msgs, "tools": []})
    assert with_empty.text == render_chat(qwen35, {"messages": msgs}).text


@pytest.mark.models
def test_string_tool_arguments_are_parsed_when_template_reads_objects(qwen3: ChatTemplate) -> None:
    """With object-argument caps the server parses the arguments string, and tojson re-prints it."""
    fn = {"name": "read", "arguments": '{"path":"a.txt","n":2.0}'}
    call = {"id": "c1", "type": "function", "function": fn}
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "data"}]}
    text = render_chat(qwen3, body).text
    expected = '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt", "n": 2}}\n</tool_call><|im_end|>'
    assert expected in text
    assert "<|im_start|>user\n<tool_response>\ndata\n</tool_response><|im_end|>\n" in text


@pytest.mark.models
def test_object_tool_arguments_render_as_parameters_when_qwen35(qwen35: ChatTemplate) -> None:
    fn = {"name": "read", "arguments": {"path": "a.txt", "opts": {"x": 1}}}
    call = {"type": "function", "function": fn}
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "user", "content": "ok"}]}
    text = render_chat(qwen35, body).text
    assert ("<tool_call>\n<function=read>\n<parameter=path>\na.txt\n</parameter>\n"
            '<parameter=opts>\n{"x": 1}\n</parameter>\n</function>\n</tool_call><|im_end|>') in text


@pytest.mark.models
def test_text_parts_are_joined_with_newlines_when_template_takes_strings_only(qwen3: ChatTemplate) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    text = render_chat(qwen3, {"messages": [{"role": "user", "content": parts}]}).text
    assert text.startswith("<|im_start|>user\na\nb<|im_end|>")


@pytest.mark.models
def test_text_parts_are_concatenated_by_the_template_when_it_takes_typed_content(
    qwen35: ChatTemplate,
) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    text = render_chat(qwen35, {"messages": [{"role": "user", "content": parts}]}).text
    assert text.startswith("<|im_start|>user\nab<|im_end|>")


@pytest.mark.models
def test_template_error_falls_back_to_canonical_render_when_template_raises(qwen35: ChatTemplate) -> None:
    """Qwen3.5 raises without a user query; the client still gets an identity, marked fallback."""
    body = {"messages": [{"role": "system", "content": "S"}]}
    r = render_chat(qwen35, body)
    assert r.path == "fallback" and r.error and "No user query" in r.error
    assert r.text == canonical_render(None, body["messages"]) == "<|system|>\nS\n<|assistant|>\n"


@pytest.mark.models
@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": 3, "content": "x"}]},
    {"messages": [{"role": "user", "content": {"a": 1}}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]},
    {"messages": [{"role": "user", "content": "x"}], "tools": {"not": "a list"}},
    {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]},
    {"messages": "nope"},
])
def test_input_the_server_rejects_renders_canonically_when_shape_is_wrong(
    qwen3: ChatTemplate, body: dict[str, Any]
) -> None:
    r = render_chat(qwen3, body)
    assert r.path == "fallback" and r.error and r.error.startswith("rejected")
    assert r.text == render_chat(qwen3, json.loads(json.dumps(body))).text  # deterministic


def test_broken_template_source_falls_back_when_it_does_not_compile() -> None:
    r = render_chat(ChatTemplate(source="{% for %}"), {"messages": [{"role": "user", "content": "x"}]})
    assert r.path == "fallback" and r.text == "<|user|>\nx\n<|assistant|>\n"


def test_canonical_render_only_appends_when_messages_are_appended() -> None:
    msgs: list[Any] = [{"role": "system", "content": "S"}, {"role": "user", "content": {"odd": True}}]
    short = canonical_render([TOOL], msgs, False)
    longer = canonical_render([TOOL], [*msgs, {"role": "weird role!", "content": "x"}], True)
    assert longer.startswith(short)
    assert "<|message|>" in longer


def test_globals_and_dict_keys_follow_llama_rules_when_used_by_a_template() -> None:
    """`d.items` is the key's value when present (llama.cpp has no Python methods); trim strips C
    whitespace only; none prints nothing; floats print like std::to_string."""
    src = ("{{ d.items }}|{{ d.get('other') }}|{{ '  x\u3000 '|trim }}|"
           "{% set ns = namespace(n=3) %}{{ ns.n }}|"
           "{{ strftime_now('%Y')|length }}|{{ none }}|{{ 1.5 }}|{{ true }}")
    body = {"messages": [], "chat_template_kwargs": {"d": {"items": "K", "other": 7}}}
    r = render_chat(ChatTemplate(source=src), body)
    assert (r.path, r.text) == ("template", "K|7|x\u3000|3|4||1.5|True")


def test_raise_exception_makes_the_render_fall_back() -> None:
    r = render_chat(ChatTemplate(source="{{ raise_exception('boom') }}"), {"messages": []})
    assert r.path == "fallback" and "boom" in (r.error or "")


@pytest.mark.models
def test_compiled_templates_and_renders_are_cached_when_inputs_repeat(qwen3: ChatTemplate) -> None:
    cache = TemplateCache(max_templates=1, max_renders=2)
    assert cache.compile("a{{ 1 }}") is cache.compile("a{{ 1 }}")
    tmpl = ChatTemplate(source=qwen3.source, caps=QWEN3_CAPS, cache=cache)
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    first = render_chat(tmpl, body).text
    assert render_chat(tmpl, json.loads(json.dumps(body))).text == first
    assert cache.render_hits == 1
    render_chat(tmpl, {"messages": [{"role": "user", "content": "other"}]})
    assert cache.compile(qwen3.source) is cache.compile(qwen3.source)


def test_templates_sharing_a_cache_never_get_each_others_renders() -> None:
    """The render key names the template source (through a digest kept per source): two templates in
    one cache, the same body, two renders; each served again from the cache as its own."""
    cache = TemplateCache(max_templates=1)  # the digests outlive the compiled templates they came from
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    a = ChatTemplate(source="A{% for m in messages %}{{ m.content }}{% endfor %}", cache=cache)
    b = ChatTemplate(source="B{% for m in messages %}{{ m.content }}{% endfor %}", cache=cache)
    for _ in range(3):
        assert (render_chat(a, body).text, render_chat(b, body).text) == ("AHi", "BHi")
    assert cache.render_hits == 4


def test_from_props_reads_template_tokens_and_caps() -> None:
    props = {"chat_template": "x", "bos_token": "<s>", "eos_token": "</s>", "chat_template_caps": QWEN3_CAPS}
    t = ChatTemplate.from_props(props)
    assert (t.source, t.bos_token, t.eos_token, dict(t.effective_caps())) == ("x", "<s>", "</s>", QWEN3_CAPS)


@pytest.mark.models
def test_a_render_leaves_nothing_for_the_collector_and_the_text_of_jinjas_own_render(
    qwen35: ChatTemplate,
) -> None:
    """Qwen3.5's template defines a macro: each render left a reference cycle (context, macro, closure)
    of ~26 objects that only the garbage collector frees, and a gateway renders every request. On
    Hermes Agent's captured request, with its history, the renders leave none and read as jinja2's own."""
    from llamafleet_core.prefix import chat_identity
    from llamafleet_testbed.hermes_layout import hermes_profile

    profile = hermes_profile()
    history = ({"role": "user", "content": "List the files."},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "README.md"})
    bodies = [profile.request("m", f"question {i}", history=history if i % 2 else ()) for i in range(6)]
    chat_identity(bodies[0], qwen35, model="m")  # compiles, and fills the caches
    gc.collect()
    gc.disable()
    try:
        texts = [chat_identity(body, qwen35, model="m").text for body in bodies]
        assert gc.collect() == 0
    finally:
        gc.enable()
    for body in bodies[:2]:
        context, source = _build_context(qwen35, body, body["messages"], True)
        compiled = qwen35.cache.compile(source)
        assert render_without_cycles(compiled, context) == compiled.render(context)
    assert all("question" in text for text in texts)
    broken = qwen35.cache.compile("{{ raise_exception('no') }}")
    with pytest.raises(TemplateError, match="no"):
        render_without_cycles(broken, {})


def test_contexts_orjson_cannot_write_get_keys_of_their_own() -> None:
    """The render key is orjson's JSON of the context, or the standard encoder's where orjson refuses
    (a lone surrogate, an integer past 64 bits): each such context is rendered and cached as its own,
    and never served another's render."""
    cache = TemplateCache()
    source = "{% for m in messages %}[{{ m.content }}]{% endfor %}{{ n }}"
    contexts = [{"messages": [{"role": "user", "content": "\ud800"}], "n": 1},
                {"messages": [{"role": "user", "content": "\ud801"}], "n": 1},
                {"messages": [{"role": "user", "content": "x"}], "n": 2**70},
                {"messages": [{"role": "user", "content": "x"}], "n": 2**70 + 1},
                {"messages": [{"role": "user", "content": "x"}], "n": 1}]
    texts = [cache.render(source, context) for context in contexts]
    assert texts == ["[\ud800]1", "[\ud801]1", f"[x]{2**70}", f"[x]{2**70 + 1}", "[x]1"]
    assert [cache.render(source, context) for context in contexts] == texts and cache.render_hits == 5


def test_tool_lists_sent_again_in_new_objects_are_normalized_once_each() -> None:
    """An agent sends the same tools in a new request object every turn: each distinct list is
    normalized once, an equal list in a new object gets that result, and the latest lists are found
    by their stored keys (whose hashes are kept) without hashing the new request's JSON."""
    cache = TemplateCache()
    lists = [[{"type": "function", "function": {"name": f"tool_{i}_{j}", "parameters": {"type": "object"}}}
              for j in range(3)] for i in range(6)]
    first = [cache.tools(json.loads(json.dumps(tools))) for tools in lists]
    again = [cache.tools(json.loads(json.dumps(tools))) for tools in lists]
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert [t.json_text for t in first[0] or []] == [t.json_text for t in normalize_tools(lists[0]) or []]
    stored = next(iter(cache._recent_keys))
    assert cache._known_key(bytes(bytearray(stored))) is stored
    assert cache._known_key(b"[]") == b"[]"

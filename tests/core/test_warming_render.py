"""The SharedPrefix text is exactly what every first-turn prompt starting with it begins with, cut at a
special token, for templates that put the tools before and after the system prompt; raw text is used
as is; snapshot names are valid and change with the text."""

from __future__ import annotations

from typing import Any

import pytest

from llamafleet_core.crd.prefix import SharedPrefixSpec
from llamafleet_core.prefix import ChatTemplate, chat_identity
from llamafleet_core.snapshot import valid_snapshot_name
from llamafleet_core.types import exact_text_hash
from llamafleet_core.warming import (
    PrefixSource,
    WarmError,
    prefix_blocks,
    render_prefix,
    snapshot_name,
)
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.fixtures.templates import TOOLS_AFTER, TOOLS_FIRST, Templates

PROFILE = make_profile(WorkloadSpec(prefix_chars=6_000))
TEMPLATES = Templates(TOOLS_FIRST, TOOLS_AFTER)


def source(**kw: Any) -> PrefixSource:
    values: dict[str, Any] = {
        "name": "agent", "model": "tiny", "tools": PROFILE.tools,
        "messages": ({"role": "system", "content": PROFILE.system_prompt},),
    }
    return PrefixSource(**{**values, **kw})


@pytest.mark.models
@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("question", ["Please list the files.", "x", "\u00fcber"])
def test_every_first_turn_prompt_starts_with_the_prefix_when_rendered_by_the_router(
    name: str, question: str
) -> None:
    """The router's own session cut of a real first-turn request is the prefix, character for character,
    and the prefix's block chain is the head of the request's chain (so index lookups find it)."""
    template = TEMPLATES[name]
    prefix = render_prefix(source(), template)
    identity = chat_identity(PROFILE.request("tiny", question), template, model="tiny")
    assert identity.rendered_by == "template"
    assert identity.text.startswith(prefix)
    assert identity.session_prefix_chars == len(prefix)
    assert prefix.endswith("<|im_end|>\n")
    assert identity.text[len(prefix):].startswith("<|im_start|>user")
    blocks = prefix_blocks(source(), prefix)
    assert len(blocks) == len(prefix) // 256
    assert identity.blocks[: len(blocks)] == blocks


@pytest.mark.models
def test_tools_come_before_the_system_prompt_when_the_template_renders_them_first() -> None:
    prefix = render_prefix(source(), TEMPLATES[TOOLS_FIRST])
    tool_name = PROFILE.tools[0]["function"]["name"]
    assert 0 <= prefix.index(tool_name) < prefix.index(PROFILE.system_prompt[:60])


@pytest.mark.models
def test_tools_come_after_the_system_prompt_when_the_template_renders_them_after() -> None:
    prefix = render_prefix(source(), TEMPLATES[TOOLS_AFTER])
    tool_name = PROFILE.tools[0]["function"]["name"]
    assert 0 <= prefix.index(PROFILE.system_prompt[:60]) < prefix.index(tool_name)


@pytest.mark.models
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_tools_alone_or_system_alone_render_a_prefix(name: str) -> None:
    only_tools = render_prefix(source(messages=()), TEMPLATES[name])
    only_system = render_prefix(source(tools=()), TEMPLATES[name])
    assert PROFILE.tools[0]["function"]["name"] in only_tools
    assert PROFILE.system_prompt in only_system and "<tools>" not in only_system


@pytest.mark.models
def test_raw_text_is_used_as_is_whatever_the_template() -> None:
    raw = "You are terse.\n<|im_start|>system\nraw"
    assert render_prefix(source(text=raw, tools=(), messages=()), TEMPLATES[TOOLS_FIRST]) == raw
    assert render_prefix(source(text=raw, tools=(), messages=()), ChatTemplate(source="")) == raw


@pytest.mark.parametrize("template", [
    ChatTemplate(source="{{ raise_exception('nope') }}"),  # the template refuses
    ChatTemplate(source=""),  # the model has no template: a canonical render would not be what it sees
])
def test_render_failure_is_a_warm_error_when_the_template_cannot_render(template: ChatTemplate) -> None:
    with pytest.raises(WarmError, match="template render failed"):
        render_prefix(source(), template)


@pytest.mark.models
def test_a_prefix_without_anything_is_a_warm_error() -> None:
    with pytest.raises(WarmError):
        render_prefix(source(tools=(), messages=()), TEMPLATES[TOOLS_FIRST])


def test_snapshot_name_is_valid_and_follows_the_text_when_names_are_odd() -> None:
    h1, h2 = exact_text_hash("a"), exact_text_hash("b")
    plain = snapshot_name(source(), h1)
    assert plain == f"sp-agent-{h1[:12]}"
    assert snapshot_name(source(), h2) != plain
    for odd in ("Agent/Prefix..x", "." * 5, "x" * 300, "über prompt"):
        name = snapshot_name(source(name=odd), h1)
        assert valid_snapshot_name(name), name
        assert name.endswith(h1[:12])


def test_snapshot_name_refuses_a_hash_that_is_not_hex() -> None:
    with pytest.raises(ValueError):
        snapshot_name(source(), "not-a-hash")


def test_from_spec_copies_tools_messages_text_and_kwargs() -> None:
    spec = SharedPrefixSpec.model_validate({
        "fleetRef": {"name": "fleet"}, "tools": list(PROFILE.tools[:2]),
        "messages": [{"content": "You are an agent."}], "templateKwargs": {"enable_thinking": False},
    })
    src = PrefixSource.from_spec("agent", spec, "tiny")
    assert src.model == "tiny" and src.text is None
    assert src.tools == PROFILE.tools[:2]
    assert src.messages == ({"role": "system", "content": "You are an agent."},)
    assert dict(src.template_kwargs) == {"enable_thinking": False}
    raw = PrefixSource.from_spec("raw", SharedPrefixSpec.model_validate(
        {"fleetRef": {"name": "fleet"}, "text": "hello"}), "tiny")
    assert raw.text == "hello" and raw.tools == () and raw.messages == ()


def test_a_template_that_writes_the_system_prompt_into_the_first_user_turn_is_refused_clearly() -> None:
    """Gemma 3's template: `<start_of_turn>user` opens before the system prompt and nothing special
    parts it from the user's text, so no prefix holds the system prompt alone; raw text still works."""
    from llamafleet_testbed.named_models import named_chat_template

    path = named_chat_template("gemma3-270m")
    assert path is not None
    gemma = ChatTemplate(source=path.read_text(), bos_token="<bos>")
    with pytest.raises(WarmError) as caught:
        render_prefix(source(tools=()), gemma)
    assert "inside the first user message" in str(caught.value) and "`text`" in str(caught.value)
    text = "<bos><start_of_turn>user\nYou review pull requests.\n\n"
    assert render_prefix(source(text=text, messages=(), tools=()), gemma) == text

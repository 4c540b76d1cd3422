"""Render an OpenAI chat request exactly as llama-server's `/apply-template` does, with jinja2.

Why locally: the router needs the rendered prompt on every request to find which slot already holds its
prefix, and a round trip to a pod for that would cost more than the whole routing budget.

Byte identity with the server comes from copying what llama.cpp does before and during rendering
(`common/chat.cpp`, `common/jinja/`), not only from the template text:

- messages are re-built the way `common_chat_msgs_parse_oaicompat` + `to_json_oaicompat` do: only `role`,
  `content`, `reasoning_content`, `name`, `tool_call_id` and `tool_calls` survive, in that order; null
  content becomes ""; content parts become `[{type, text}]`, or one string joined with "\\n" when the
  template only takes string content (caps); tool-call arguments that are not strings are dumped
  compactly, and parsed back into objects when the template reads them as objects (caps);
- tools are re-built as `{"type": "function", "function": {name, description, parameters}}`, and an empty
  tool list means no `tools` variable at all;
- `tojson` prints `", "` / `": "` separators, keeps key order, does not escape non-ASCII unless asked and
  prints floats like C++ streams (`%g`); `{{ x }}` prints nothing for none, `True`/`False` for booleans;
- `trim`/`strip` remove only C whitespace; globals `raise_exception`, `strftime_now`, `namespace`, and
  context `datetime`, `date_string`, `enable_thinking`, `bos_token`, `eos_token`, `chat_template_kwargs`.

The caps (which content shapes and argument shapes the template reads) come from `/props`
(`chat_template_caps`); without them a source-text heuristic stands in.

A request the template cannot render (or llama-server would reject) is serialised canonically instead
(`canonical_render`): deterministic, and appending messages only appends text, so block hashes still
share prefixes between turns. Rendering never raises to the caller; the result says which path was used.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from llamafleet_core.prefix.normalize import Rejected, normalize_messages
from llamafleet_core.prefix.template_cache import TemplateCache, TemplateError

RenderPath = Literal["template", "fallback"]
_OBJECT_ARGS = re.compile(r"arguments\s*(\|\s*(items|tojson)|\.items\(\))")
_ROLE_NAME = re.compile(r"[A-Za-z0-9_\-]{1,32}")


class PromptError(ValueError):
    """The request has no shape a prompt can be derived from (e.g. `messages` is not a list).

    The only exception this package raises on client input; the router turns it into a 400.
    """


@dataclass(frozen=True)
class Rendered:
    text: str
    path: RenderPath
    error: str | None = None  # why the template path was not used


# Turn markers of template families whose special tokens are not spelled `<|...|>` (the prompt identity's
# default markers), each a control token of its family's vocabulary, which llama.cpp splits out of the
# text before tokenizing it: a cut just before one keeps the token-prefix rule (identity.py).
TURN_MARKERS = ("<start_of_turn>", "<end_of_turn>")  # Gemma 2 and 3
_PIPE_TOKEN = re.compile(r"<\|[^\s<>|]{1,64}\|>")


# A template that opens with `{{ bos_token }}` is one whose vocab adds BOS itself (the Hugging Face
# convention for Gemma and Llama 3): llama-server then strips the rendered BOS (`common_chat_templates_apply`
# adds it as a token), and `/props` does not say so.
_LEADING_BOS = re.compile(r"\s*(?:\{#.*?#\}\s*)*\{\{-?\s*bos_token\s*-?\}\}", re.DOTALL)


@functools.lru_cache(maxsize=16)
def template_markers(source: str) -> tuple[str, ...] | None:
    """The special-token markers a template's renders are cut at (pure): None (the identity's `<|...|>`
    default) unless the template writes one of `TURN_MARKERS`, then those it writes and every
    `<|...|>` token it spells."""
    found = [m for m in TURN_MARKERS if m in source]
    return (*found, *sorted(set(_PIPE_TOKEN.findall(source)))) if found else None


@functools.lru_cache(maxsize=16)
def _heuristic_caps(source: str) -> Mapping[str, bool]:
    """What `jinja::caps_get` would likely find, when `/props` did not tell us."""
    typed = bool(re.search(r"for \w+ in (message\.|message\[.content.\]|)content", source))
    return MappingProxyType({  # shared by every render of the template: read-only
        "supports_string_content": True,
        "supports_typed_content": typed,
        "supports_system_role": "system" in source,
        "supports_tool_calls": "tool_calls" in source,
        "supports_object_arguments": bool(_OBJECT_ARGS.search(source)),
    })


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template plus what llama-server adds around it (from `GET /props`)."""

    source: str
    bos_token: str = ""
    eos_token: str = ""
    caps: Mapping[str, bool] | None = None
    tool_use_source: str | None = None  # `chat_template_tool_use`, used when tools are present
    enable_thinking: bool | None = None  # server default; None: on when the template knows <think>
    default_kwargs: Mapping[str, Any] = field(default_factory=dict)  # --chat-template-kwargs
    add_bos: bool = False  # the vocab adds BOS itself, so a leading bos_token is stripped
    cache: TemplateCache = field(default_factory=TemplateCache, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)

    @classmethod
    def from_props(cls, props: Mapping[str, Any], cache: TemplateCache | None = None) -> ChatTemplate:
        caps = props.get("chat_template_caps")
        return cls(
            source=str(props.get("chat_template") or ""),
            bos_token=str(props.get("bos_token") or ""),
            eos_token=str(props.get("eos_token") or ""),
            caps=dict(caps) if isinstance(caps, Mapping) else None,
            tool_use_source=props.get("chat_template_tool_use") or None,
            add_bos=bool(_LEADING_BOS.match(str(props.get("chat_template") or ""))),
            cache=cache if cache is not None else TemplateCache(),
        )

    @property
    def markers(self) -> tuple[str, ...] | None:
        """Where its renders may be cut (`template_markers`)."""
        return template_markers(self.source)

    def effective_caps(self) -> Mapping[str, bool]:
        return self.caps if self.caps is not None else _heuristic_caps(self.source)

    def thinking_default(self) -> bool:
        if self.enable_thinking is not None:
            return self.enable_thinking
        return "<think>" in self.source


def render_chat(
    template: ChatTemplate | None,
    body: Mapping[str, Any],
    *,
    messages: Sequence[Any] | None = None,
    add_generation_prompt: bool | None = None,
    remember: bool = True,
) -> Rendered:
    """Render `body` (or `body` with `messages` replaced) the way `/apply-template` does; never raises.

    `add_generation_prompt=None` follows the request (default true, false when the last message is the
    assistant's, which llama-server continues). That continuation is rendered as the history without a
    generation prompt, which matches the server up to the continued message. `remember=False` skips
    the render cache (for a render that will not repeat).
    """
    msgs = body.get("messages") if messages is None else messages
    agp = add_generation_prompt
    if agp is None:
        agp = body.get("add_generation_prompt", True) is not False
        last = msgs[-1] if isinstance(msgs, list) and msgs else None
        if isinstance(last, Mapping) and last.get("role") == "assistant":
            agp = False
    def fallback(why: str) -> Rendered:
        return Rendered(canonical_render(body.get("tools"), msgs, agp), "fallback", why)

    if template is None or not template.source:
        return fallback("no template")
    try:
        context, source = _build_context(template, body, msgs, agp)
        text = template.cache.render(source, context, remember=remember)
    except Rejected as exc:
        return fallback(f"rejected: {exc}")
    except (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
            RecursionError, OverflowError) as exc:
        return fallback(f"{type(exc).__name__}: {exc}")
    if template.add_bos and template.bos_token and text.startswith(template.bos_token):
        text = text[len(template.bos_token):]
    return Rendered(text, "template")


def _build_context(
    template: ChatTemplate, body: Mapping[str, Any], msgs: Any, agp: bool
) -> tuple[dict[str, Any], str]:
    caps = template.effective_caps()
    tools = template.cache.tools(body.get("tools"))
    source = template.tool_use_source if tools is not None and template.tool_use_source else template.source
    kwargs: dict[str, Any] = dict(template.default_kwargs)
    req_kwargs = body.get("chat_template_kwargs")
    if isinstance(req_kwargs, Mapping):
        kwargs.update(req_kwargs)
    elif req_kwargs is not None:
        raise Rejected("chat_template_kwargs is not an object")
    thinking = template.thinking_default()
    if kwargs.get("enable_thinking") is True or kwargs.get("enable_thinking") is False:
        thinking = bool(kwargs["enable_thinking"])
    effort = body.get("reasoning_effort")
    if effort == "none":
        thinking = False
        kwargs.pop("reasoning_effort", None)
    elif isinstance(effort, str) and effort:
        kwargs["reasoning_effort"] = effort
    now = time.localtime(template.clock())
    context: dict[str, Any] = {
        "messages": normalize_messages(msgs, caps, source),
        "bos_token": template.bos_token,
        "eos_token": template.eos_token,
        "enable_thinking": thinking,
    }
    if tools is not None:
        context["tools"] = tools
    context["datetime"] = time.strftime("%b %d %Y", now)
    context["date_string"] = time.strftime("%d %b %Y", now)
    context.update(kwargs)
    if agp:
        context["add_generation_prompt"] = True
    if isinstance(context.get("preserve_reasoning"), bool):
        keep = context["preserve_reasoning"]
        context.update(preserve_thinking=keep, clear_thinking=not keep,
                       truncate_history_thinking=not keep, drop_thinking=not keep)
    if isinstance(context.get("reasoning_effort"), str) and context["reasoning_effort"]:
        context["reasoning_strength"] = context["reasoning_effort"]
    return context, source


def canonical_render(tools: Any, messages: Any, add_generation_prompt: bool = True) -> str:
    """The fallback serialization: `<|tools|>`, then `<|role|>` per message, then `<|assistant|>`.

    Each section is `<|name|>\\n` + compact sorted JSON (or the string content as is) + `\\n`. It is
    deterministic, and appending a message only appends text, so prefixes keep sharing blocks. The
    `<|...|>` markers let the session cut find message starts exactly as with real templates.
    """
    out: list[str] = []
    if tools:
        out.append("<|tools|>\n" + _canon(tools) + "\n")
    if isinstance(messages, list):
        for msg in messages:
            if not isinstance(msg, Mapping):
                out.append("<|message|>\n" + _canon(msg) + "\n")
                continue
            role = msg.get("role")
            name = role if isinstance(role, str) and _ROLE_NAME.fullmatch(role) else "message"
            content = msg.get("content")
            out.append(f"<|{name}|>\n" + (content if isinstance(content, str) else _canon(content)) + "\n")
            rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
            if name == "message" and role is not None:
                rest["role"] = role
            if rest:
                out.append(_canon(rest) + "\n")
    elif messages is not None:
        out.append("<|messages|>\n" + _canon(messages) + "\n")
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def _canon(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=repr)

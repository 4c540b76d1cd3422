"""The full prompt without rendering it: the cached render of its shape with the question put in.

An agent's requests share everything but the text of their last user message, and rendering the whole
template again for every one of them is a fraction of a millisecond on the request path (docs/design.md,
"The full prompt is the cached render of its shape"). Instead, the request is rendered once per
*shape* (every message, the tools and the options, with the last user message's text replaced by a
sentinel) through the render cache, and the question's text is put where the sentinel came out.

That is exact only where the template copies the text verbatim and its branches do not look at it.
Both are checked, never assumed:

- **The shape.** The sentinel must come out exactly once, whole or trimmed of the whitespace at its
  ends (most templates `trim` the text), and a second render, with another sentinel, must equal the
  first one with the sentinel swapped. The sentinel holds what a filter would change: quotes,
  backslashes and `&<>` (`tojson`, `escape`), letters of both cases (`upper`, `lower`), a control
  character. The result is kept per cached render.
- **The text.** Templates branch on a user message's text to find markers (`<tool_response>`,
  `</think>`, `[TOOL_RESULTS]`); a text qualifies only with no `<` or `[` and no whitespace at either
  end, so it takes every branch the sentinels take.

Anything else (parts instead of a string, a template that transforms or inspects the text, a fallback
render) renders the whole prompt as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamafleet_core.prefix.template import ChatTemplate, Rendered, render_chat

_CORE = "\x01aZ\"'\\&<>{}"
SENTINEL = "\t" + _CORE + "\n"
_OTHER = "\x02"
_MAX_VERDICTS = 256


def plain_text(content: Any) -> bool:
    """Whether `content` takes the sentinels' branches in any template that passes the shape check."""
    if not isinstance(content, str) or not content:
        return False
    if content[0].isspace() or content[-1].isspace():
        return False
    return "<" not in content and "[" not in content


def _with_content(messages: list[Any], idx: int, text: str) -> list[Any]:
    out = list(messages)
    out[idx] = {**messages[idx], "content": text}
    return out


def substituted(
    template: ChatTemplate | None, body: Mapping[str, Any], messages: list[Any], idx: int
) -> tuple[Rendered, str, int] | None:
    """(the full prompt, the shape's cached render, where the question's text starts in both), or None
    when the prompt must be rendered whole. `idx` is the last user message."""
    if template is None or idx < 0 or not isinstance(messages[idx], Mapping):
        return None
    content = messages[idx].get("content")
    if not plain_text(content):
        return None
    shape = render_chat(template, body, messages=_with_content(messages, idx, SENTINEL))
    if shape.path != "template":
        return None
    text = shape.text
    found = _verdict(template, body, messages, idx, text)
    if found is None:
        return None
    pos, end = found
    return Rendered(text[:pos] + content + text[end:], "template"), text, pos


def _verdict(
    template: ChatTemplate, body: Mapping[str, Any], messages: list[Any], idx: int, text: str
) -> tuple[int, int] | None:
    """Where the sentinel came out in `text` (start, end) when the shape passes, else None."""
    # The render cache hands back the same string for the same shape: its id is the key, and holding
    # the string keeps the id from being reused while the verdict is kept.
    verdicts = template.cache.substitutions
    seen = verdicts.get(id(text))
    if seen is not None and seen[0] is text:
        return seen[1]
    found = _located(text)
    if found is not None:
        pos, end = found
        # Not through the render cache: this render is only ever compared once.
        other = render_chat(template, body, messages=_with_content(messages, idx, _OTHER), remember=False)
        if other.path != "template" or other.text != text[:pos] + _OTHER + text[end:]:
            found = None
    if len(verdicts) >= _MAX_VERDICTS:
        verdicts.clear()
    verdicts[id(text)] = (text, found)
    return found


def _located(text: str) -> tuple[int, int] | None:
    for mark in (SENTINEL, _CORE):
        pos = text.find(mark)
        if pos >= 0:
            return (pos, pos + len(mark)) if text.find(_CORE, pos + len(mark)) < 0 else None
    return None

"""The prefix text of a SharedPrefix and the name of its snapshot: pure functions.

The prefix must tokenize to exactly the first tokens of every full prompt that starts with it, or the
snapshot is useless (a hybrid model resumes only from an exact point; an attention-only model would reuse
only up to the first differing token). So it is cut the way the router cuts a session prefix
(`prefix.identity`): render tools + system messages followed by a probe user message, and cut at the
special token where that user message starts. Reusing `chat_identity` also guarantees that the router's
own cut of a first-turn request lands on the same character, so the blocks the index records for the
snapshot are the blocks the router looks up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from llamafleet_core.prefix import BLOCK_CHARS, ChatTemplate, PromptError, block_chain, chat_identity
from llamafleet_core.warming.model import PrefixSource, WarmError

# Any first user message works: the cut lands where its text would begin, before the text itself.
_PROBE_USER = "Hello"
_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")
_MAX_SLUG = 96  # snapshot names are at most 128 characters: "sp-" + slug + "-" + 12 hex digits


def prefix_body(source: PrefixSource) -> dict[str, Any]:
    """The chat request a client starting with this prefix sends first (with a probe user message)."""
    body: dict[str, Any] = {
        "messages": [*(dict(m) for m in source.messages), {"role": "user", "content": _PROBE_USER}],
    }
    if source.tools:
        body["tools"] = [dict(t) for t in source.tools]
    if source.template_kwargs:
        body["chat_template_kwargs"] = dict(source.template_kwargs)
    return body


def render_prefix(source: PrefixSource, template: ChatTemplate) -> str:
    """The exact prefix text: raw `text` as is, else tools + system messages up to the first user turn.

    Raises `WarmError` when the template cannot render the messages: a canonical fallback render would
    not match what llama-server tokenizes, so warming it would only waste every pod's memory.
    """
    if source.text is not None:
        if not source.text:
            raise WarmError("the prefix text is empty")
        return source.text
    if not source.messages and not source.tools:
        raise WarmError("the prefix has neither text nor messages nor tools")
    try:
        identity = chat_identity(prefix_body(source), template, model=source.model)
    except PromptError as exc:
        raise WarmError(f"template render failed: {exc}") from exc
    if identity.rendered_by != "template":
        raise WarmError("template render failed: the model's chat template did not render the prefix")
    cut = identity.session_prefix_chars
    if cut <= 0:
        raise WarmError("template render failed: no special-token boundary before the first user message")
    if any(text not in identity.text[:cut] for text in _own_texts(source.messages)):
        # Gemma's template writes the system prompt into the first user turn, with no special token
        # between them: the last boundary before the user's text is before the system prompt.
        raise WarmError("the chat template puts the system prompt inside the first user message, with no "
                        "special token between them (Gemma's does), so no prefix of the prompt holds it "
                        "alone: give the SharedPrefix as `text`, rendered up to where sessions part")
    return identity.text[:cut]


def _own_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The string contents of the prefix's messages, as a template writes them (trimmed)."""
    contents = (m.get("content") for m in messages)
    return [c.strip() for c in contents if isinstance(c, str) and c.strip()]


def snapshot_name(source: PrefixSource, text_hash: str) -> str:
    """`sp-<name>-<hash12>`: a valid snapshot name that changes whenever the prefix text changes.

    The hash in the name is what makes warming idempotent and a spec change a new snapshot: the old
    and new snapshot coexist until the old one is removed, so pods never hold a half-updated prefix.
    """
    slug = re.sub(r"\.{2,}", ".", _NAME_CHARS.sub("-", source.name.lower()))  # ".." is never valid
    slug = slug.strip(".-")[:_MAX_SLUG].strip(".-") or "prefix"
    digest = re.sub(r"[^0-9a-f]", "", text_hash.lower())[:12]
    if len(digest) < 12:
        raise ValueError(f"text_hash must be a hex digest, got {text_hash!r}")
    return f"sp-{slug}-{digest}"


def prefix_blocks(
    source: PrefixSource, text: str, block_chars: int = BLOCK_CHARS, key: bytes = b""
) -> tuple[str, ...]:
    """The block chain the router computes for any prompt starting with `text` (seeded by the model;
    `key`: the routers' `prefix_key`, as `prefix_key_bytes` makes it). A SharedPrefix is shared by every
    tenant, so it is hashed in the namespace all keys share."""
    return block_chain(text, seed=source.model, block_chars=block_chars, key=key)

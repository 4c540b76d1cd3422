"""A request's prompt identity: its rendered text, block-hash chain and session-prefix cut.

The session prefix is the part of the prompt before the last user message: for an agent, the tools,
the system prompt and the history, which the next session (or the next turn) will send again. The
gateway snapshots it and routes on it, so it must satisfy one hard rule: **its tokens are exactly the
first tokens of the full prompt.** A cut in the middle of text breaks that: BPE merges across the cut
differ (`"Hello wor" + "ld"` does not tokenize as `"Hello world"`). A cut just before a special token
(`<|im_start|>` for Qwen) is safe, because llama.cpp splits special tokens out of the text before BPE
runs, so the text on each side tokenizes on its own.

How the cut is found, without knowing the template:
1. Render the messages before the last user message, without a generation prompt. The full prompt
   and this render agree up to where the last user message starts, or earlier when the template
   renders history differently once a later user message exists (Qwen3.5 adds empty `<think>` blocks
   to assistant turns after the last query); take their longest common prefix.
2. Render a probe: the same history followed by a user message with a constant one-character text.
   It parts from the full prompt exactly where the last user message's text begins, and it also
   works where step 1 cannot render (Qwen3.5 raises when no user message exists, so the very first
   turn has no "before" render). Take the later of the two cut points.
3. Back off from that position to the start of the last special-token marker at or before it
   (`<|...|>` by default, or the given `markers`), so the cut is a token boundary. Every candidate is
   a special-token start inside the full prompt, so any of them keeps the token-prefix rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llamafleet_core.prefix.hashing import BLOCK_CHARS, block_chain, extend_chain, namespaced_seed, prefix_tag
from llamafleet_core.prefix.substitute import substituted
from llamafleet_core.prefix.template import ChatTemplate, PromptError, canonical_render, render_chat
from llamafleet_core.types import UNKEYED, PromptTags, TextHasher

RenderedBy = Literal["template", "fallback", "raw"]
_SPECIAL = re.compile(r"<\|[^\s<>|]{1,64}\|>")
_MAX_CHAINS = 64  # session-prefix chains kept per TemplateCache (each a tuple of ~240 short strings)


@dataclass(frozen=True)
class PromptIdentity:
    """What the router keys a request by. `blocks[i]` covers `text[: (i + 1) * block_chars]`."""

    model: str
    text: str
    blocks: tuple[str, ...]
    block_chars: int
    session_prefix_chars: int
    rendered_by: RenderedBy
    # Where the FIRST user message starts (tools and system prompt: what every session of an agent
    # shares). Equal to `session_prefix_chars` for a first turn; shorter once a conversation has history,
    # whose own prefix (history included) no other session will send. None: same as the session prefix.
    shared_prefix_chars: int | None = None
    # Exact identities (`prefix_tag`) of the text before the first user message (`shared_chars`) and of
    # the text through its end (`first_message_end`): the index tags a slot with them (`tags`), so a
    # lookup can tell a slot holding this very head, or this very conversation, from one that parts
    # from it inside a block. None when unknown.
    head_tag: str | None = None
    conversation_tag: str | None = None
    # What the exact prefixes of `text` are hashed with (snapshot names, head families, first-sight
    # flights): the same key and namespace as `blocks`.
    hasher: TextHasher = UNKEYED

    @property
    def shared_chars(self) -> int:
        return self.session_prefix_chars if self.shared_prefix_chars is None else self.shared_prefix_chars

    @property
    def tags(self) -> PromptTags:
        return PromptTags(self.head_tag, self.shared_chars // self.block_chars, self.conversation_tag)

    @property
    def session_blocks(self) -> tuple[str, ...]:
        """Hashes of the full blocks that lie inside the session prefix."""
        return self.blocks[: self.session_prefix_chars // self.block_chars]


def special_token_start(text: str, pos: int, markers: Sequence[str] | None = None) -> int:
    """The start of the last special-token marker that begins at or before `pos` (0 when none)."""
    pos = max(0, min(pos, len(text)))
    if markers:
        best = 0
        for marker in markers:
            if marker:
                found = text.rfind(marker, 0, pos + len(marker))
                best = max(best, found)
        return best
    start = text.rfind("<|", 0, pos + 2)  # the last "<|" starting at or before pos
    while start >= 0:
        if _SPECIAL.match(text, start):
            return start
        start = text.rfind("<|", 0, start + 1)  # "<|" cannot fit before start + 1, so strictly earlier
    return 0


_LCP_STEP = 4096


def _lcp(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    # Find the first differing window, then bisect inside it: bisecting the whole text copied ~2 MB
    # of slices for a 60K-character prompt.
    lo = 0
    while lo + _LCP_STEP <= n and a[lo:lo + _LCP_STEP] == b[lo:lo + _LCP_STEP]:
        lo += _LCP_STEP
    hi = min(lo + _LCP_STEP, n)  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _user_indices(messages: list[Any]) -> tuple[int, int]:
    """Indices of the first and the last user message ((-1, -1) when there is none)."""
    users = [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"]
    return (users[0], users[-1]) if users else (-1, -1)


def _probe_content(content: Any) -> str:
    """A constant content whose first character differs from `content`'s."""
    first = content if isinstance(content, str) else ""
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        text = content[0].get("text")
        first = text if isinstance(text, str) else ""
    return "\x02" if first.startswith("\x01") else "\x01"


def _session_cut(
    template: ChatTemplate | None, body: Mapping[str, Any], messages: list[Any], full: str,
    path: str, markers: Sequence[str] | None, idx: int,
) -> tuple[int, str]:
    """The cut before user message `idx`, and the render it was found with: `full[:cut]` is a prefix of
    that render too."""
    if idx < 0:
        return len(full), full
    if path == "fallback":
        plain = canonical_render(body.get("tools"), messages[:idx], False)
        return special_token_start(full, _lcp(plain, full), markers), plain
    # The probe: the same history followed by a constant user message. Its render is shared by every
    # session with that history (so the render cache serves it), and it parts from the full prompt
    # exactly where the last user message's text begins.
    probe = [*messages[:idx], {"role": "user", "content": _probe_content(messages[idx].get("content"))}]
    probed = render_chat(template, body, messages=probe, add_generation_prompt=False)
    if probed.path == "template":
        return special_token_start(full, _lcp(probed.text, full), markers), probed.text
    before = render_chat(template, body, messages=messages[:idx], add_generation_prompt=False)
    if before.path == "template":
        return special_token_start(full, _lcp(before.text, full), markers), before.text
    return 0, full


def _chain(
    text: str, cut: int, basis: str, template: ChatTemplate | None, seed: str, block_chars: int,
    key: bytes = b"",
) -> tuple[str, ...]:
    """`block_chain(text)`, reusing the chain of the session prefix's whole blocks when seen before.

    Keyed by the render the cut came from: the render cache hands back the same string object for a
    repeated session prefix, whose hash Python keeps, so the key costs nothing to hash or compare, and
    only the blocks after the session prefix are hashed (an agent's 60K-character prompt: 240 blocks
    down to the few of its new question)."""
    n_full = cut // block_chars
    if template is None or n_full == 0:
        return block_chain(text, seed=seed, block_chars=block_chars, key=key)
    chains = template.cache.chains
    entry = (seed, key, block_chars, basis, n_full)
    head = chains.get(entry)
    if head is None:
        head = block_chain(text[: n_full * block_chars], seed=seed, block_chars=block_chars, key=key)
        chains[entry] = head
        while len(chains) > _MAX_CHAINS:
            chains.popitem(last=False)
    else:
        chains.move_to_end(entry)
    return extend_chain(head, text, seed=seed, block_chars=block_chars, key=key)


def chat_identity(
    body: Mapping[str, Any],
    template: ChatTemplate | None,
    *,
    model: str,
    block_chars: int = BLOCK_CHARS,
    markers: Sequence[str] | None = None,
    substitute: bool = True,
    namespace: str = "",
    key: bytes = b"",
) -> PromptIdentity:
    """Identity of a `/v1/chat/completions` body. Raises only `PromptError` (no usable `messages`).
    `substitute=False` always renders the whole prompt (the reference the fast path is tested against).
    `namespace` (a tenant group) and `key` (the fleet's hash key) change the hashes (block chain, tags
    and `hasher`), never the text (`hashing.py`)."""
    if not isinstance(body, Mapping):
        raise PromptError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise PromptError("'messages' must be an array")
    if markers is None and template is not None:
        markers = template.markers  # Gemma's turns: `<start_of_turn>` (template.py)
    try:
        first, last = _user_indices(messages)
        # The full prompt ends in a new question: its shape's cached render with the question put in,
        # or (when that is not exact) rendered whole, once, so not through the render cache.
        fast = substituted(template, body, messages, last) if substitute else None
        if fast is not None:
            rendered, basis, question = fast
            cut = special_token_start(rendered.text, question, markers)
        else:
            rendered = render_chat(template, body, remember=False)
            cut, basis = _session_cut(template, body, messages, rendered.text, rendered.path, markers, last)
        shared = cut
        if first != last:  # a conversation with history: the probe render of its head is cached
            shared = min(cut, _session_cut(
                template, body, messages, rendered.text, rendered.path, markers, first)[0])
        if block_chars <= 0:
            raise ValueError("block_chars must be positive")
        seed = namespaced_seed(model, namespace)
        blocks = _chain(rendered.text, cut, basis, template, seed, block_chars, key)
        head = conversation = None
        if first >= 0:
            head = prefix_tag(blocks, rendered.text, shared, seed=seed, block_chars=block_chars, key=key)
            end = first_message_end(rendered.text, shared, markers) if rendered.path == "template" else 0
            if end:
                conversation = prefix_tag(blocks, rendered.text, end, seed=seed, block_chars=block_chars,
                                          key=key)
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. block_chars <= 0, unencodable seed
        raise PromptError(str(exc)) from exc
    return PromptIdentity(model, rendered.text, blocks, block_chars, cut, rendered.path, shared, head,
                          conversation, TextHasher(key, namespace))


def first_message_end(text: str, start: int, markers: Sequence[str] | None = None) -> int:
    """Where the message opening at `start` (the first user message: a special-token marker) ends: the
    next marker after its own (0 when there is none). `text[:end]` is then the head plus the first
    question, what every turn of one conversation renders alike (later turns only append to it)."""
    if markers:
        opened = next((start + len(m) for m in markers if m and text.startswith(m, start)), 0)
        if not opened:
            return 0
        found = [i for m in markers if m and (i := text.find(m, opened)) >= 0]
        return min(found, default=0)
    opened_m = _SPECIAL.match(text, start)
    if opened_m is None:
        return 0
    nxt = _SPECIAL.search(text, opened_m.end())
    return nxt.start() if nxt is not None else 0


def completion_identity(
    body: Mapping[str, Any], *, model: str, block_chars: int = BLOCK_CHARS, namespace: str = "",
    key: bytes = b"",
) -> PromptIdentity:
    """Identity of a `/v1/completions` body: a string prompt as is, anything else canonically."""
    if not isinstance(body, Mapping) or "prompt" not in body:
        raise PromptError("'prompt' is required")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        text, by = prompt, "raw"
    else:
        text = canonical_render(None, [{"role": "prompt", "content": prompt}], False)
        by = "fallback"
    try:
        blocks = block_chain(text, seed=namespaced_seed(model, namespace), block_chars=block_chars, key=key)
    except (ValueError, TypeError) as exc:
        raise PromptError(str(exc)) from exc
    rendered_by: RenderedBy = "raw" if by == "raw" else "fallback"
    return PromptIdentity(model, text, blocks, block_chars, len(text), rendered_by,
                          hasher=TextHasher(key, namespace))

"""Where a prefix may be cut into a snapshot, and how a snapshot's name carries its exact identity.

Pure functions, no I/O.

**Token-exact cuts.** A snapshot holds tokens, a request brings text; a hybrid (recurrent) model reuses
a snapshot only when the request's tokens strictly extend ALL of the snapshot's tokens. So a cut must
(1) fall on a token boundary of the tokenized session prefix (known exactly from `/tokenize` pieces),
and (2) be a place where any later text tokenizes the same way up to the cut. Two kinds of places
satisfy (2) for the BPE tokenizers llama.cpp serves:
- the start of a special token (`<|im_end|>`): llama.cpp splits special tokens out before BPE runs;
- the start of a line whose first character is not whitespace: the pre-tokenizer ends a pre-token at
  a newline run, and BPE never merges across pre-tokens.
A wrong cut costs speed (the server recomputes), never correctness: it compares token ids itself.

**Stage points** are such cuts inside the session prefix where later sessions are likely to part from
this one: the special-token boundaries (after the tools section, the system turn) and the start of the
prefix's last text line, which agent clients fill with `Conversation started: <date>`, so a next-day
session resumes from the snapshot just before it. **Divergence points** are the same kind of cut at or
before where this prompt stops matching another known prompt (see `divergence_point`).

**Names.** `<kind>-<text_hash>-<n_chars>`: the name alone tells which exact text a snapshot holds, so
snapshots listed by an agent after a restart can be recorded again with their exact identity (the
manifest keeps only blocks and tokens). `text_hash` is keyed with the fleet's `prefix_key` and the
tenant's namespace (`types.exact_text_hash`): a name tells nothing to whoever lacks the key, and the
same key (kept across restarts) names the same text alike.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamafleet_core.snapshot import SnapshotManifest, valid_snapshot_name
from llamafleet_core.types import SnapshotRef

_SPECIAL = re.compile(r"<\|[^\s<>|]{1,64}\|>")
_NAME = re.compile(r"(fs|st|dv)-([0-9a-f]{32})-([0-9]{1,9})")

KINDS = ("fs", "st", "dv")  # first sight (whole session prefix), stage point, divergence point


_PARAGRAPHS = 2  # paragraph starts before the last line that become stage points
_PARAGRAPH_GAP = 16  # characters: closer cuts are the same place


def snapshot_name(kind: str, text_hash: str, n_chars: int) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown snapshot kind {kind!r}")
    name = f"{kind}-{text_hash}-{n_chars}"
    if not valid_snapshot_name(name):
        raise ValueError(f"invalid snapshot name {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class NamedIdentity:
    kind: str
    text_hash: str
    n_chars: int


def parse_name(name: str) -> NamedIdentity | None:
    """The identity a router-made snapshot name carries; None for other names (e.g. SharedPrefix)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    return NamedIdentity(m.group(1), m.group(2), int(m.group(3)))


def ref_from_manifest(manifest: SnapshotManifest, pod_uid: str, block_chars: int) -> SnapshotRef | None:
    """The index entry for a snapshot an agent lists, or None when it cannot be recorded exactly.

    Only snapshots whose exact text identity is known qualify (from the manifest, or from a router
    snapshot's name: without it, a hybrid model could be handed a snapshot the prompt does not extend),
    cut with this router's block size, and covering at least one block."""
    if manifest.text_hash and manifest.n_chars:
        n_chars, text_hash = manifest.n_chars, manifest.text_hash
    elif (ident := parse_name(manifest.name)) is not None:
        n_chars, text_hash = ident.n_chars, ident.text_hash
    else:
        return None
    if manifest.block_chars != block_chars or not manifest.blocks:
        return None
    if len(manifest.blocks) != n_chars // block_chars:
        return None
    return SnapshotRef(
        name=manifest.name, pod_uid=pod_uid, n_blocks=len(manifest.blocks), n_tokens=manifest.n_tokens,
        size_bytes=manifest.size, last_block=manifest.blocks[-1], n_chars=n_chars, text_hash=text_hash,
    )


class TokenEnds:
    """Where each token of a tokenized text ends, so a character cut can be mapped to a token count.

    Kept in UTF-8 bytes, not characters: llama-server gives a token that is not valid UTF-8 on its own
    (a piece of an emoji or of a CJK character) as a list of byte values, and one token may end inside
    a character (`[32, 240, 159]`: a space and half an emoji). Agent clients' prompts carry such text
    (dashes, arrows, emoji in tool descriptions); counting in characters gave up on every one of them,
    so no stage snapshot was ever cut in a real client's prompt."""

    __slots__ = ("_ends", "_text")

    def __init__(self, text: str, byte_ends: Sequence[int]) -> None:
        self._text = text
        self._ends = tuple(byte_ends)

    @classmethod
    def from_pieces(cls, text: str, pieces: Sequence[object]) -> TokenEnds | None:
        """None when the pieces do not spell `text`. A leading piece the text does not contain (a BOS
        token added by `add_special`) covers 0 bytes: it is part of every cut."""
        raw: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, str):
                raw.append(piece.encode("utf-8", "surrogatepass"))
            elif isinstance(piece, list) and all(isinstance(b, int) and 0 <= b < 256 for b in piece):
                raw.append(bytes(piece))
            else:
                return None
        target = text.encode("utf-8", "surrogatepass")
        skip = 0
        if b"".join(raw) != target:
            if not raw or b"".join(raw[1:]) != target:
                return None
            skip = 1
        ends = [0] * skip
        pos = 0
        for piece_bytes in raw[skip:]:
            pos += len(piece_bytes)
            ends.append(pos)
        return cls(text, ends)

    def __len__(self) -> int:
        return len(self._ends)

    def tokens_at(self, chars: int) -> int | None:
        """How many leading tokens cover exactly `text[:chars]`, or None if the cut splits a token."""
        if not 0 <= chars <= len(self._text):
            return None
        target = len(self._text[:chars].encode("utf-8", "surrogatepass"))
        i = bisect_left(self._ends, target)  # first token ending at or after the cut
        return i + 1 if i < len(self._ends) and self._ends[i] == target else None


def safe_cuts(text: str, start: int, end: int) -> list[int]:
    """Every safe cut position in `text[start:end]` (see the module docstring), ascending."""
    cuts = {m.start() for m in _SPECIAL.finditer(text, start, end)}
    pos = text.find("\n", start, end)
    while pos >= 0:
        nxt = pos + 1
        if nxt < end and not text[nxt].isspace():
            cuts.add(nxt)
        pos = text.find("\n", nxt, end)
    return sorted(c for c in cuts if start < c < end)


def last_line_start(text: str, end: int) -> int:
    """Start of the last text line before `end`, skipping trailing special tokens and newlines
    (`...\\n\\nConversation started: Monday<|im_end|>\\n` -> the position of `Conversation`)."""
    stop = end
    while stop > 0:
        trimmed = text[:stop].rstrip()
        m = re.search(r"<\|[^\s<>|]{1,64}\|>$", trimmed)
        if m is None:
            stop = len(trimmed)
            break
        stop = m.start()
    nl = text.rfind("\n", 0, stop)
    return nl + 1 if nl >= 0 else 0


def stage_points(text: str, head_chars: int, *, min_chars: int, min_gap: int, limit: int) -> list[int]:
    """Char positions inside the session prefix at which to save stage snapshots, ascending.

    In order of preference, at most `limit`:
    - the last line's start (the date line: the next day's prompt parts there);
    - the starts of the `_PARAGRAPHS` paragraphs before it (an agent's system prompt ends in blocks
      that differ per workspace or user: another workspace's first session resumes at the block's
      start, a few tokens before its own text, instead of computing the whole prefix); these may lie
      close together, since what matters is where prompts part, not how much a cut saves;
    - special-token starts at least `min_gap` characters from the session end and from each other
      (a cut a few tokens before another saves nothing), the latest first."""
    end = head_chars
    chosen: list[int] = []
    line = last_line_start(text, end)
    if min_chars <= line < end and line in safe_cuts(text, line - 1, line + 1):
        chosen.append(line)
    for pos in paragraph_starts(text, min_chars, line if chosen else end)[-_PARAGRAPHS:][::-1]:
        if len(chosen) < limit and all(abs(pos - c) >= _PARAGRAPH_GAP for c in chosen):
            chosen.append(pos)
    specials = sorted((m.start() for m in _SPECIAL.finditer(text, 0, end)), reverse=True)
    for pos in specials:
        if len(chosen) >= limit:
            break
        if pos < min_chars or end - pos < min_gap:
            continue
        if all(abs(pos - c) >= min_gap for c in chosen):
            chosen.append(pos)
    return sorted(chosen[:limit])


def paragraph_starts(text: str, start: int, end: int) -> list[int]:
    """Starts of the paragraphs (text after a blank line) in `text[start:end]`, ascending."""
    out = []
    pos = text.find("\n\n", start, end)
    while pos >= 0:
        nxt = pos + 2
        while nxt < end and text[nxt] == "\n":
            nxt += 1
        if start <= nxt < end and not text[nxt].isspace():
            out.append(nxt)
        pos = text.find("\n\n", nxt, end)
    return out


def divergence_point(text: str, common_chars: int, *, min_chars: int) -> int | None:
    """The last safe cut at or before `common_chars` (what this prompt shares with another), or None.

    The index knows shared prefixes in whole blocks, so `common_chars` is a lower bound of the real
    divergence: the cut may lie up to a block plus a line before it. Keep it simple: a line start or a
    special token, never a cut inside a line."""
    if common_chars < min_chars:
        return None
    cuts = safe_cuts(text, max(0, min_chars - 1), min(common_chars + 1, len(text)))
    cuts = [c for c in cuts if c <= common_chars]
    return cuts[-1] if cuts else None


def held_stage(
    text: str, head_chars: int, held_chars: int, snapshots: Sequence[SnapshotRef], *, window: int,
    hasher: Callable[[str], str] | None = None,
) -> SnapshotRef | None:
    """The longest snapshot of `text` ending within `window` characters before the session prefix's
    end and not past what the slot holds (`held_chars`): the stage a detached build can start from while
    the request itself computes only the tail in its own slot."""
    best: SnapshotRef | None = None
    for snap in snapshots:
        tail = head_chars - snap.n_chars
        if not snap.text_hash or not 0 < tail <= window or snap.n_chars > held_chars:
            continue
        if (best is None or snap.n_chars > best.n_chars) and snap.extended_by(text, hasher):
            best = snap
    return best

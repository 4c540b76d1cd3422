"""Divergence points learned from traffic: where a new head parts from the heads the fleet built.

A head is the text before the first user message (tools and system prompt). Agent clients put what
changes between sessions (a date, a model name, a session id, a working folder, an environment block,
a toolchain probe that answers one day and not the next) at places no layout rule can know in advance:
one real client puts its date three lines before the head's end, after the paragraph a rule "cut before
the last line" expected it in. So the gateway learns them:

1. **Where this head parts from what the fleet holds.** At first sight of a head, its chain of safe
   cuts (`cut_chain`: a hash chain over its line starts and special tokens) is compared with the
   chains of the heads of its family that the index recorded (`HeadFamily.heads`): the last cut they
   share is the last line start before the texts part. What slots hold counts too, in whole blocks
   (`Lookup.slots`: the last safe cut before the shared run's end). That cut becomes a snapshot of its
   own, so the next session parting there (tomorrow's) resumes exactly at it, which a hybrid needs.
   Whole blocks alone could place it only to the block, often before the paragraph's start that is a
   stage already, and so teach nothing.
2. **Where heads of this family part, remembered.** The cut is recorded in the index as a
   `DivergencePoint` of the family (counted from the head's start and from its end), so it outlives
   the gateway, its slots and its pods. Every later first sight in the family saves a stage at each
   recorded point it passes through: at the same place when the text before it is the same (a
   snapshot evicted since is rebuilt), else at the same distance from its own end (another workspace's
   head: its date line sits as far from its end), snapped back to a safe cut.

Line, paragraph and special-token boundaries stay as stage candidates beside these (`cuts.stage_points`):
they serve a head's very first later day, before anything could be learned. Pure functions, no I/O.

Every hash here (cut chains, head and point identities) is keyed with the fleet's `prefix_key`, as the
block chain is (`TextHasher`): the index holds them, and unkeyed they would let whoever reads it test a
guessed system prompt offline, line by line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b

from llamafleet_core.prefix.hashing import common_blocks
from llamafleet_core.types import UNKEYED, DivergencePoint, HeadFamily, HeadRecord, TextHasher
from llamafleet_router.snapshots.cuts import divergence_point, safe_cuts

_CUT_DIGEST = 8  # bytes per cut hash: 16 hex characters, as block hashes
_CUT_PERSON = b"llamafleet/cuts"


@dataclass(frozen=True, slots=True)
class LearnedCuts:
    """The cuts a head's build saves beyond its stage points, the divergence point it teaches the
    family (None when it parts from nothing the fleet holds), and the head's own record."""

    cuts: tuple[int, ...] = ()
    point: DivergencePoint | None = None
    head: HeadRecord | None = None


def family_of(blocks: tuple[str, ...] | list[str]) -> str | None:
    """A head's family: heads sharing their first block (the chain is seeded with the model, so a
    family never spans models). None for a head shorter than one block."""
    return blocks[0] if blocks else None


def cut_chain(text: str, head_chars: int, key: bytes = b"") -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The safe cuts inside the head and a hash chain over them: hash k covers `text[:cuts[k]]`, so two
    heads share their first k hashes exactly when they share the text up to their k-th cut (and cut
    it alike). Hashes only, keyed with `key` (the fleet's): what the index keeps of a head reveals
    none of its text, even to a reader guessing it. No key: unkeyed, as before."""
    cuts = tuple(safe_cuts(text, 0, head_chars))
    hashes: list[str] = []
    prev, start = b"", 0
    person = _CUT_PERSON if key else b""  # unkeyed: the chain as it always was
    for cut in cuts:
        h = blake2b(prev, digest_size=_CUT_DIGEST, key=key, person=person)
        h.update(text[start:cut].encode("utf-8", "surrogatepass"))
        prev, start = h.digest(), cut
        hashes.append(prev.hex())
    return cuts, tuple(hashes)


def head_record(text: str, head_chars: int, hasher: TextHasher = UNKEYED) -> HeadRecord:
    """The index's record of a head: its cut chain, length and exact identity (keyed by `hasher`)."""
    return HeadRecord(cut_chain(text, head_chars, hasher.key)[1], head_chars, hasher(text[:head_chars]))


def learned_cuts(
    text: str, head_chars: int, blocks: tuple[str, ...], family: HeadFamily, slot_runs: Iterable[int],
    *, block_chars: int, min_chars: int, limit: int, held: Iterable[int] = (),
    hasher: TextHasher = UNKEYED,
) -> LearnedCuts:
    """The cuts for a head of `text[:head_chars]` learned from its family and from what slots hold.
    `blocks`: the prompt's block chain (what slot runs count in).

    `slot_runs`: how many leading blocks of the prompt each slot holds (`Lookup.slots.values()`).
    `held`: lengths of exact prefixes of this text that snapshots hold (stages it extends): a stage
    past the shared cut that this head still extends (a slot's run counts only to the block) is where
    it parts at the latest known, and neither a cut nor a point goes before it; a cut a stage holds
    already is not saved again. At most `limit` cuts; the one where this head parts from a held head
    comes first. `hasher`: the prompt identity's (the fleet's key, the tenant's namespace)."""
    positions, chain = cut_chain(text, head_chars, hasher.key)
    own_hash = hasher(text[:head_chars])
    others = [h for h in family.heads if h.text_hash != own_hash]
    shared_cuts = max((common_blocks(chain, h.cuts) for h in others), default=0)
    cut = positions[shared_cuts - 1] if shared_cuts else 0
    n_blocks = head_chars // block_chars
    runs = [n for n in slot_runs if 0 < n < n_blocks]
    if runs:
        cut = max(cut, divergence_point(text, max(runs) * block_chars, min_chars=min_chars) or 0)
    cuts: list[int] = []
    point: DivergencePoint | None = None
    if cut:
        proven = max((n for n in held if n < head_chars), default=0)
        at = max(cut, proven)
        if min_chars <= at < head_chars:
            if at > proven:  # a stage already holds `proven`: nothing to save there
                cuts.append(at)
            point = DivergencePoint(at, head_chars - at, hasher(text[:at]))
    for known in family.points:
        if len(cuts) >= limit:
            break
        placed = _place(text, head_chars, known, min_chars, hasher)
        if placed is not None and placed not in cuts:
            cuts.append(placed)
    return LearnedCuts(tuple(sorted(cuts[:limit])), point, HeadRecord(chain, head_chars, own_hash))


def _place(
    text: str, head_chars: int, known: DivergencePoint, min_chars: int, hasher: TextHasher,
) -> int | None:
    """Where a family's divergence point falls in this head: the same cut when the text before it is
    the same, else the last safe cut at or before the same distance from this head's end."""
    if min_chars <= known.chars < head_chars and hasher(text[: known.chars]) == known.text_hash:
        return known.chars
    cut = divergence_point(text, head_chars - known.from_end, min_chars=min_chars)
    return cut if cut is not None and cut < head_chars else None

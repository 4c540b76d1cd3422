"""Divergence points learned from traffic: where a new head parts from the heads the fleet built.

A head is the text before the first user message (tools and system prompt). Agent clients put what
changes between sessions (a date, a model name, a session id, a working folder, an environment block,
a toolchain probe that answers one day and not the next) at places no layout rule can know in advance:
one real client puts its date three lines before the head's end, after the paragraph a rule "cut before
the last line" expected it in. So the gateway learns them:

1. **Where this head parts from what the fleet holds.** At first sight of a head, its whole-block chain
   is compared with the chains of the heads of its family that the index recorded (`HeadFamily.heads`)
   and with what the slots hold (`Lookup.slots`). The longest shared run bounds the place the texts
   part; the last safe cut at or before it (`cuts.divergence_point`) becomes a snapshot of its own, so
   the next session parting there (tomorrow's) resumes exactly at it, which a hybrid model needs.
2. **Where heads of this family part, remembered.** The cut is recorded in the index as a
   `DivergencePoint` of the family (counted from the head's start and from its end), so it outlives
   the gateway, its slots and its pods. Every later first sight in the family saves a stage at each
   recorded point it passes through: at the same place when the text before it is the same (a
   snapshot evicted since is rebuilt), else at the same distance from its own end (another workspace's
   head: its date line sits as far from its end), snapped back to a safe cut.

Line, paragraph and special-token boundaries stay as stage candidates beside these (`cuts.stage_points`):
they serve a head's very first later day, before anything could be learned. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llamafleet_core.prefix.hashing import common_blocks
from llamafleet_core.types import DivergencePoint, HeadFamily, HeadRecord, exact_text_hash
from llamafleet_router.snapshots.cuts import divergence_point


@dataclass(frozen=True, slots=True)
class LearnedCuts:
    """The cuts a head's build saves beyond its stage points, and the divergence point it teaches the
    family (None when it parts from nothing the fleet holds)."""

    cuts: tuple[int, ...] = ()
    point: DivergencePoint | None = None


def family_of(blocks: tuple[str, ...] | list[str]) -> str | None:
    """A head's family: heads sharing their first block (the chain is seeded with the model, so a
    family never spans models). None for a head shorter than one block."""
    return blocks[0] if blocks else None


def head_record(text: str, head_chars: int, blocks: tuple[str, ...], block_chars: int) -> HeadRecord:
    """The index's record of a head: its whole blocks, length and exact identity."""
    whole = tuple(blocks[: head_chars // block_chars])
    return HeadRecord(whole, head_chars, exact_text_hash(text[:head_chars]))


def learned_cuts(
    text: str, head_chars: int, blocks: tuple[str, ...], family: HeadFamily, slot_runs: Iterable[int],
    *, block_chars: int, min_chars: int, limit: int, held: Iterable[int] = (),
) -> LearnedCuts:
    """The cuts for a head of `text[:head_chars]` learned from its family and from what slots hold.

    `slot_runs`: how many leading blocks of the prompt each slot holds (`Lookup.slots.values()`).
    `held`: lengths of exact prefixes of this text that snapshots hold (stages it extends): whole
    blocks place a parting only to the block, so a stage past that bound that this head still extends
    is where it parts at the latest known, and neither a cut nor a point goes before it. At most
    `limit` cuts; the one where this head parts from a held head comes first."""
    head = head_record(text, head_chars, blocks, block_chars)
    n_blocks = len(head.blocks)
    shared = [common_blocks(head.blocks, h.blocks) for h in family.heads if h.text_hash != head.text_hash]
    shared += [n for n in slot_runs if 0 < n < n_blocks]
    cuts: list[int] = []
    point: DivergencePoint | None = None
    if shared and max(shared) > 0:
        cut = divergence_point(text, max(shared) * block_chars, min_chars=min_chars) or 0
        proven = max((n for n in held if n < head_chars), default=0)
        at = max(cut, proven)
        if min_chars <= at < head_chars:
            if at > proven:  # a stage already holds `proven`: nothing to save there
                cuts.append(at)
            point = DivergencePoint(at, head_chars - at, exact_text_hash(text[:at]))
    for known in family.points:
        if len(cuts) >= limit:
            break
        placed = _place(text, head_chars, known, min_chars)
        if placed is not None and placed not in cuts:
            cuts.append(placed)
    return LearnedCuts(tuple(sorted(cuts[:limit])), point)


def _place(text: str, head_chars: int, known: DivergencePoint, min_chars: int) -> int | None:
    """Where a family's divergence point falls in this head: the same cut when the text before it is
    the same, else the last safe cut at or before the same distance from this head's end."""
    if min_chars <= known.chars < head_chars and exact_text_hash(text[: known.chars]) == known.text_hash:
        return known.chars
    cut = divergence_point(text, head_chars - known.from_end, min_chars=min_chars)
    return cut if cut is not None and cut < head_chars else None

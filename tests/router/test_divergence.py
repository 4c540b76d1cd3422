"""Divergence points learned from traffic (router/snapshots/divergence.py): pure, no server.

The heads here are laid out like a real agent client's, whose varying line is not its last one: a
paragraph of rules, a working-folder line, the date, then two more lines."""

from __future__ import annotations

from llamafleet_core.prefix.hashing import block_chain, common_blocks
from llamafleet_core.types import DivergencePoint, HeadFamily, HeadRecord, exact_text_hash
from llamafleet_router.snapshots.divergence import (
    LearnedCuts,
    cut_chain,
    family_of,
    head_record,
    learned_cuts,
)

BC = 64
MIN = 128
RULES = "".join(f"Rule {i}: keep every answer short and exact.\n" for i in range(40))


def head(day: int, folder: str = "/home/dev/service", rules: str = RULES) -> str:
    return (f"<|im_start|>system\n{rules}\nCurrent working directory: {folder}\n\n"
            f"Conversation started: December {day:02d}, 2026\nModel: tiny\nProvider: custom<|im_end|>\n")


def cuts_for(text: str, family: HeadFamily, slot_runs: tuple[int, ...] = (), limit: int = 4) -> LearnedCuts:
    blocks = block_chain(text, seed="m", block_chars=BC)
    return learned_cuts(text, len(text), blocks, family, slot_runs,
                        block_chars=BC, min_chars=MIN, limit=limit)


def record(text: str) -> HeadRecord:
    return head_record(text, len(text))


def test_a_later_day_parts_from_yesterdays_head_at_a_line_start_before_its_date() -> None:
    day1, day2 = head(1), head(2)
    learned = cuts_for(day2, HeadFamily(heads=(record(day1),)))
    assert learned.point is not None and learned.cuts == (learned.point.chars,)
    cut = learned.point.chars
    date = day2.index("Conversation started")
    assert cut <= date and day2[:cut] == day1[:cut]  # the text before the cut is shared exactly
    assert cut == date  # the last line start whose text both heads share: to the line, not the block
    assert learned.point.from_end == len(day2) - cut
    assert learned.point.text_hash == exact_text_hash(day2[:cut])


def test_the_same_head_teaches_nothing_and_a_slot_run_places_the_cut_to_the_block() -> None:
    day1, day2 = head(1), head(2)
    same = cuts_for(day1, HeadFamily(heads=(record(day1),)))
    assert same.cuts == () and same.point is None and same.head == record(day1)
    blocks1 = block_chain(day1, seed="m", block_chars=BC)
    run = common_blocks(blocks1, block_chain(day2, seed="m", block_chars=BC))
    by_slot = cuts_for(day2, HeadFamily(), slot_runs=(run,))
    assert by_slot.point is not None and by_slot.cuts == (by_slot.point.chars,)
    assert day2[by_slot.point.chars - 1] == "\n" and by_slot.point.chars <= run * BC
    by_family = cuts_for(day2, HeadFamily(heads=(record(day1),)))
    assert by_family.point is not None and by_slot.point.chars <= by_family.point.chars


def test_a_family_point_is_placed_at_the_same_cut_when_the_text_before_it_is_the_same() -> None:
    day1, day2, day3 = head(1), head(2), head(3)
    point = cuts_for(day2, HeadFamily(heads=(record(day1),))).point
    assert point is not None
    # Day 3 with nothing held but the learned point: its build saves exactly that cut again.
    learned = cuts_for(day3, HeadFamily(points=(point,)))
    assert learned.cuts == (point.chars,) and learned.point is None


def test_another_workspace_gets_the_point_at_the_same_distance_from_its_end() -> None:
    day1, day2 = head(1), head(2)
    point = cuts_for(day2, HeadFamily(heads=(record(day1),))).point
    assert point is not None
    other = head(5, folder="/home/dev/a/much/longer/path/to/another/service",
                 rules=RULES.replace("short", "brief"))
    learned = cuts_for(other, HeadFamily(points=(point,)))
    assert len(learned.cuts) == 1
    cut = learned.cuts[0]
    assert other[cut - 1] == "\n" and cut <= len(other) - point.from_end
    assert len(other) - point.from_end - cut < 80  # snapped back to the line start before


def test_learned_cuts_are_bounded_and_points_out_of_range_are_ignored() -> None:
    text = head(2)
    points = tuple(DivergencePoint(10_000 + i, len(text) - 200 + 7 * i, f"x{i}") for i in range(10))
    learned = cuts_for(text, HeadFamily(points=points), limit=3)
    assert len(learned.cuts) <= 3 and all(MIN <= c < len(text) for c in learned.cuts)
    far = DivergencePoint(5, 10 * len(text), "y")  # further from the end than this head is long
    assert cuts_for(text, HeadFamily(points=(far,))).cuts == ()


def test_a_family_is_named_by_the_first_block() -> None:
    chain = block_chain(head(1), seed="m", block_chars=BC)
    assert family_of(chain) == chain[0] == family_of(block_chain(head(2), seed="m", block_chars=BC))
    assert family_of(()) is None


def test_a_stage_the_head_still_extends_bounds_the_point_and_is_not_saved_again() -> None:
    """A slot's run places a parting only to the block; yesterday's stage at the date's paragraph start,
    which today's head still extends, lies past that. The stage is the point learned, and nothing is
    saved for it: it exists."""
    day1, day2 = head(1), head(2)
    stage = day2.index("Conversation started")
    blocks = block_chain(day2, seed="m", block_chars=BC)
    run = common_blocks(block_chain(day1, seed="m", block_chars=BC), blocks)
    assert run * BC < stage  # the case the rule is for
    learned = learned_cuts(day2, len(day2), blocks, HeadFamily(), (run,),
                           block_chars=BC, min_chars=MIN, limit=4, held=(stage, len(day2) + 5))
    assert learned.point is not None and learned.point.chars == stage and learned.cuts == ()


def test_the_cut_chain_holds_hashes_only_and_parts_where_the_text_does() -> None:
    a, b = head(1), head(2)
    cuts_a, chain_a = cut_chain(a, len(a))
    cuts_b, chain_b = cut_chain(b, len(b))
    assert all(len(h) == 16 and h not in a for h in chain_a)
    k = common_blocks(chain_a, chain_b)
    assert cuts_a[:k] == cuts_b[:k] and cuts_a[k - 1] == a.index("Conversation started")

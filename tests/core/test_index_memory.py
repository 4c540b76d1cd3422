"""The in-memory index's block -> slots walk agrees with comparing every entry's chain (hypothesis)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.index import InMemoryPrefixIndex
from llamafleet_core.types import SlotRef
from tests.core.test_index_contract import chain, text

MODEL = "m"


def common(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(1, 6)), max_size=25),
    query=st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 6)),
)
def test_lookup_matches_brute_force_when_slots_share_prefixes_of_any_length(
    entries: list[tuple[int, int, int]], query: tuple[int, int, int]
) -> None:
    """Each entry is one of 4 base texts cut at some block plus its own tail; whatever the run lengths
    (many distinct drop points, none, all equal), the lookup gives each slot its longest common prefix,
    and re-recording a slot drops what it held before."""
    bases = [text(12, f"base-{i}") for i in range(4)]

    def blocks(base: int, keep: int, tail: int, tag: str) -> list[str]:
        return chain(bases[base][: keep * 8] + text(tail, tag))

    async def run() -> None:
        index = InMemoryPrefixIndex()
        held: dict[SlotRef, list[str]] = {}
        for i, (base, keep, tail) in enumerate(entries):
            slot = SlotRef(f"pod-{i % 5}", i % 3)  # collisions re-record a slot
            held[slot] = blocks(base, keep, tail, f"t{i}")
            await index.record_slot(MODEL, slot, held[slot], 1)
        q = blocks(*query, "query")
        expected = {ref: n for ref, b in held.items() if (n := common(b, q)) > 0}
        assert (await index.lookup(MODEL, q)).slots == expected

    asyncio.run(run())

"""Block-hash chain: hash i names the whole prefix of i+1 blocks, per model, full blocks only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.prefix.hashing import BLOCK_CHARS, block_chain, common_blocks, extend_chain

texts = st.text(max_size=2000)
sizes = st.integers(min_value=1, max_value=64)


def test_only_full_blocks_are_hashed_when_text_has_a_partial_tail() -> None:
    """A tail shorter than a block changes as the prompt grows, so it is never hashed."""
    assert block_chain("x" * (BLOCK_CHARS - 1), seed="m") == ()
    assert len(block_chain("x" * BLOCK_CHARS, seed="m")) == 1
    assert len(block_chain("x" * (3 * BLOCK_CHARS + 7), seed="m")) == 3


def test_hashes_are_16_hex_chars_when_blake2b_8_bytes() -> None:
    chain = block_chain("abc" * 100, seed="m", block_chars=10)
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in chain)


def test_equal_blocks_get_different_hashes_when_at_different_positions() -> None:
    """Each hash covers everything before it, so repeating text does not repeat hashes."""
    chain = block_chain("a" * 40, seed="m", block_chars=10)
    assert len(set(chain)) == 4


def test_change_in_one_block_changes_that_hash_and_all_later_ones_when_earlier_blocks_equal() -> None:
    base = "".join(chr(65 + i) * 10 for i in range(6))
    changed = base[:25] + "z" + base[26:]
    a, b = block_chain(base, seed="m", block_chars=10), block_chain(changed, seed="m", block_chars=10)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))
    assert common_blocks(a, b) == 2


def test_models_share_no_hash_when_text_is_equal() -> None:
    text = "same prompt " * 100
    a, b = block_chain(text, seed="model-a"), block_chain(text, seed="model-b")
    assert a and not set(a) & set(b)


def test_non_positive_block_size_is_rejected() -> None:
    with pytest.raises(ValueError):
        block_chain("abc", seed="m", block_chars=0)


def test_lone_surrogates_hash_when_json_decoding_produced_them() -> None:
    """json.loads accepts "\\ud800": hashing must not crash on such text."""
    assert len(block_chain("\ud800" * 20, seed="m", block_chars=10)) == 2


@settings(max_examples=200, deadline=None)
@given(texts, st.integers(min_value=0, max_value=2000), sizes)
def test_chain_of_a_prefix_is_a_prefix_of_the_chain(text: str, cut: int, block: int) -> None:
    """The property the index relies on: a prompt's first k hashes are its k-block prefix's hashes."""
    prefix = text[: min(cut, len(text))]
    full = block_chain(text, seed="m", block_chars=block)
    part = block_chain(prefix, seed="m", block_chars=block)
    assert full[: len(part)] == part
    assert len(part) == len(prefix) // block


@settings(max_examples=200, deadline=None)
@given(texts, texts, sizes)
def test_common_blocks_is_symmetric_and_counts_shared_full_blocks(a: str, b: str, block: int) -> None:
    ca, cb = block_chain(a, seed="m", block_chars=block), block_chain(b, seed="m", block_chars=block)
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    expected = min(shared // block, len(ca), len(cb))
    assert common_blocks(ca, cb) == common_blocks(cb, ca) == expected


@settings(max_examples=100, deadline=None)
@given(texts, texts, sizes)
def test_extend_chain_equals_hashing_from_scratch_when_given_a_prefix_chain(
    a: str, b: str, block: int
) -> None:
    prefix = block_chain(a, seed="m", block_chars=block)
    assert extend_chain(prefix, a + b, seed="m", block_chars=block) == block_chain(
        a + b, seed="m", block_chars=block
    )

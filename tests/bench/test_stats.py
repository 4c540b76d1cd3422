"""The seed table's arithmetic: spreads, ratios, the perfect-cache minimum, greedy agreement, KV sizes."""

from __future__ import annotations

import math

from llamafleet_testbed.bench.stats import (
    Spread,
    agreement,
    common_prefix,
    kv_shape,
    minimum_prefill,
    ratio,
    share,
)


def test_spread_is_the_median_and_range_of_repeats() -> None:
    """Repeated runs report their median and min-max; a single run shows no range."""
    s = Spread.of([0.3, 0.1, 0.2, 0.9])
    assert (s.median, s.low, s.high, s.n) == (0.25, 0.1, 0.9, 4)
    assert s.fmt() == "0.250 s (0.100-0.900)"
    assert Spread.of([1.5]).fmt() == "1.500 s"
    assert Spread.of([]).n == 0 and Spread.of([]).fmt() == "n/a"


def test_ratio_is_nan_when_a_figure_is_missing() -> None:
    """A missing or zero baseline must never read as an enormous gain."""
    assert ratio(3.0, 0.25) == 12.0
    assert math.isnan(ratio(3.0, 0.0))
    assert math.isnan(ratio(float("nan"), 1.0))


def test_minimum_prefill_counts_each_shared_prefix_once_when_prompts_share_prefixes() -> None:
    """Each distinct prefix is computed once, then every prompt's own tail: the trie's node count."""
    prefix = list(range(100))
    prompts = [[*prefix, 1000, 1001], [*prefix, 2000], [*prefix[:50], 3000, 3001, 3002],
               [*prefix, 1000, 1001]]
    assert minimum_prefill(prompts) == 100 + 2 + 1 + 3
    assert minimum_prefill([]) == 0
    assert minimum_prefill([[1, 2, 3], [4, 5]]) == 5  # nothing shared: everything computed


def test_minimum_prefill_does_not_depend_on_order() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 9], [1, 7]]
    assert minimum_prefill(prompts) == minimum_prefill(list(reversed(prompts))) == 6


def test_agreement_counts_missing_positions_as_different_when_lengths_differ() -> None:
    """A shorter output cannot score 100%: positions compared are the longer output's."""
    assert agreement(["a", "b", "c"], ["a", "b", "c"]) == (3, 3)
    assert agreement(["a", "x", "c"], ["a", "b", "c"]) == (2, 3)
    assert agreement(["a"], ["a", "b"]) == (1, 2)
    assert share([(3, 3), (1, 2)]) == 0.8
    assert math.isnan(share([]))


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_kv_bytes_per_token_when_dense_and_when_hybrid() -> None:
    """Attention-only models hold K and V in every layer; a hybrid only in its full-attention layers."""
    dense = kv_shape("qwen2", n_layer=2, n_embd=64, n_head=4, n_head_kv=2)
    assert dense.bytes_per_token == 2 * 2 * 16 * 2 * 2  # layers * kv heads * head dim * (K, V) * f16
    hybrid = kv_shape("qwen35", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16,
                      full_attention_interval=4)
    assert hybrid.attention_layers == 1 and hybrid.bytes_per_token == 128

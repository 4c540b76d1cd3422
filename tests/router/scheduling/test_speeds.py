"""Per-pod speeds learned from answers and restores, and what they change in the action choice."""

from __future__ import annotations

import pytest

from llamafleet_core.types import Action, Lookup, SnapshotRef
from llamafleet_router.scheduling.action import choose_action
from llamafleet_router.scheduling.costs import ActionCosts, restore_seconds
from llamafleet_router.scheduling.speeds import FULL_SAMPLE_TOKENS, SpeedBook

from .fakes import MODEL, chain, endpoint, text_hash
from .fakes import prompt as make_prompt

CPU = ActionCosts(min_batch_tokens=64)
# 240 blocks of 256 characters at 4 per token: a 15,360-token prompt whose last user message starts
# 20 tokens before its end.
PROMPT = make_prompt(MODEL, chain("p", 240), session_prefix_chars=240 * 256 - 80)
DENSE, HYBRID = endpoint("b"), endpoint("b", resume_anywhere=False)
UID = DENSE.pod.uid


def test_nothing_changes_until_a_figure_has_enough_observations() -> None:
    book = SpeedBook(CPU)
    assert book.costs(UID) is CPU
    book.observe_prompt(DENSE, PROMPT, cached=0, computed=15_360, seconds=3.0)
    assert book.costs(UID).prefill_tokens_per_s == CPU.prefill_tokens_per_s
    assert book.learned(UID) == {}
    book.observe_prompt(DENSE, PROMPT, cached=0, computed=15_360, seconds=3.0)
    assert book.costs(UID).prefill_tokens_per_s == pytest.approx(5_120)
    assert book.learned(UID) == {"prefill_tokens_per_s": pytest.approx(5_120)}
    assert book.costs("another-pod") is CPU


def test_the_full_batch_rate_is_a_weighted_average_and_ignores_short_answers() -> None:
    book = SpeedBook(ActionCosts(), alpha=0.5)
    for seconds in (2.0, 2.0, 4.0):
        book.observe_prompt(DENSE, PROMPT, cached=0, computed=8_000, seconds=seconds)
    assert book.costs(UID).prefill_tokens_per_s == pytest.approx((4_000 + 2_000) / 2)
    # A question after a hit runs latency-bound, even on a GPU: not a sample of the full-batch rate.
    before = book.costs(UID)
    for _ in range(5):
        book.observe_prompt(DENSE, PROMPT, cached=15_000, computed=FULL_SAMPLE_TOKENS - 1, seconds=1.0)
    assert book.costs(UID) is before


def test_small_batches_teach_the_small_batch_rate_at_the_reference_context() -> None:
    """20 tokens after 28,000 (twice the reference context) in 0.1 s: 400 tokens/s at 14,000."""
    book = SpeedBook(CPU)
    for _ in range(2):
        book.observe_prompt(DENSE, PROMPT, cached=27_980, computed=20, seconds=0.1)
    assert book.costs(UID).small_batch_tokens_per_s == pytest.approx(400)
    assert book.costs(UID).prefill_tokens_per_s == CPU.prefill_tokens_per_s


def test_a_hybrid_answer_is_split_where_the_server_cuts_it() -> None:
    """A hybrid pod computes a chat prompt's question in a batch of its own: 1,000 tokens before the
    user message (full) and 16 + 4 after it (small). The small batches' estimate (20 tokens at 100
    tokens/s) comes off before the full-batch rate is learned; on an attention-only pod the same
    answer is one full batch."""
    hybrid, dense = SpeedBook(CPU), SpeedBook(CPU)
    for _ in range(2):
        hybrid.observe_prompt(HYBRID, PROMPT, cached=14_340, computed=1_020, seconds=0.6)
        dense.observe_prompt(DENSE, PROMPT, cached=14_340, computed=1_020, seconds=0.6)
    small_s = 20 * (15_360 / CPU.small_batch_context) / CPU.small_batch_tokens_per_s
    assert hybrid.costs(UID).prefill_tokens_per_s == pytest.approx(1_000 / (0.6 - small_s))
    assert dense.costs(UID).prefill_tokens_per_s == pytest.approx(1_020 / 0.6)


def test_restores_and_pulls_learn_a_factor_on_the_configured_prediction() -> None:
    book = SpeedBook(CPU)
    snap = SnapshotRef("s", "uid-c", n_blocks=10, n_tokens=14_000, size_bytes=4_000_000)
    local, remote = restore_seconds(snap, False, CPU), restore_seconds(snap, True, CPU)
    for _ in range(3):
        book.observe_restore(UID, size_bytes=snap.size_bytes, seconds=2 * local)
        book.observe_restore(UID, size_bytes=snap.size_bytes, seconds=3 * (remote - local), pull=True)
    learned = book.costs(UID)
    assert restore_seconds(snap, False, learned) == pytest.approx(2 * local)
    assert restore_seconds(snap, True, learned) == pytest.approx(2 * local + 3 * (remote - local))


def test_costs_are_built_again_only_when_a_figure_moved_by_more_than_five_percent() -> None:
    book = SpeedBook(ActionCosts(), alpha=1.0)
    for _ in range(2):
        assert book.observe_prompt(DENSE, PROMPT, cached=0, computed=4_000, seconds=1.0)
    built = book.costs(UID)
    assert built.prefill_tokens_per_s == 4_000
    assert not book.observe_prompt(DENSE, PROMPT, cached=0, computed=4_100, seconds=1.0)
    assert book.costs(UID) is built
    assert book.observe_prompt(DENSE, PROMPT, cached=0, computed=4_300, seconds=1.0)
    assert book.costs(UID).prefill_tokens_per_s == 4_300


def test_a_pathological_answer_moves_a_figure_at_most_fifty_fold() -> None:
    book = SpeedBook(CPU, alpha=1.0)
    for _ in range(2):
        book.observe_prompt(DENSE, PROMPT, cached=0, computed=10_000, seconds=10_000.0)
    assert book.costs(UID).prefill_tokens_per_s == CPU.prefill_tokens_per_s / 50
    for bad in (0.0, -1.0):
        book.observe_prompt(DENSE, PROMPT, cached=0, computed=10_000, seconds=bad)
        book.observe_restore(UID, size_bytes=1, seconds=bad)
    assert book.costs(UID).prefill_tokens_per_s == CPU.prefill_tokens_per_s / 50


def _exact(name: str, n_chars: int) -> SnapshotRef:
    return SnapshotRef(name=name, pod_uid=UID, n_blocks=n_chars // 256, n_tokens=n_chars // 4,
                       size_bytes=4_000_000, n_chars=n_chars, text_hash=text_hash(n_chars))


def test_a_pod_whose_small_batches_are_fast_stops_restoring_the_earlier_stage() -> None:
    """With the configured CPU figures, a restore that leaves a full batch (140 tokens) beats the
    session-end snapshot that leaves 20 tokens at the small-batch rate. A pod that answers questions
    after a hit in 5 ms (a GPU's small batches) teaches the model that the closest snapshot is best
    there."""
    lookup = Lookup(snapshots=(_exact("end", 240 * 256 - 80), _exact("stage", 240 * 256 - 560)))
    book = SpeedBook(CPU)

    def picked() -> str:
        choice = choose_action(PROMPT, DENSE, 1, lookup, book.costs(UID))
        assert choice.action is Action.RESTORE and choice.snapshot is not None
        return choice.snapshot.name

    assert picked() == "stage"
    for _ in range(2):
        book.observe_prompt(DENSE, PROMPT, cached=15_340, computed=20, seconds=0.005)
        book.observe_prompt(DENSE, PROMPT, cached=0, computed=15_360, seconds=1.0)
    assert picked() == "end"


def test_a_pod_with_slow_pulls_computes_what_a_pull_would_have_brought() -> None:
    """A 40 MB snapshot on another pod covering 1,280 tokens: by the configured figures the pull and
    restore (~0.54 s) beat computing them (0.64 s at 2,000 tokens/s); once this pod's pulls are seen
    taking three times the prediction, computing wins."""
    snap = SnapshotRef("far", "uid-c", n_blocks=20, n_tokens=1_280, size_bytes=40_000_000)
    prompt = make_prompt(MODEL, chain("p", 20), session_prefix_chars=20 * 256 - 80)
    lookup = Lookup(snapshots=(snap,))
    book = SpeedBook(ActionCosts())
    assert choose_action(prompt, DENSE, 1, lookup, book.costs(UID)).action is Action.RESTORE
    pull = restore_seconds(snap, True, ActionCosts()) - restore_seconds(snap, False, ActionCosts())
    for _ in range(2):
        book.observe_restore(UID, size_bytes=snap.size_bytes, seconds=3 * pull, pull=True)
    assert choose_action(prompt, DENSE, 1, lookup, book.costs(UID)).action is Action.COMPUTE

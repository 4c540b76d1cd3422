"""Workload additions for the benchmarks: calibrated sizes, next-day prefixes, the mixed workload."""

from __future__ import annotations

import datetime as dt

from llamafleet_testbed.workload import (
    WorkloadSpec,
    chars_for_tokens,
    make_profile,
    mixed_workload,
    next_day,
)


def test_chars_for_tokens_converges_when_the_tokenizer_ratio_is_constant() -> None:
    """A few secant steps find the size, whatever the characters-per-token ratio of the tokenizer."""
    calls: list[int] = []

    def measure(chars: int) -> int:
        calls.append(chars)
        return int(chars / 4.1)

    chars = chars_for_tokens(24_000, measure)
    assert abs(measure(chars) - 24_000) <= 240
    assert len(calls) <= 4


def test_next_day_changes_only_the_date_line() -> None:
    """Next day: the same tools and system prompt up to the `Conversation started:` line."""
    spec = WorkloadSpec(prefix_chars=8_000)
    today, tomorrow = make_profile(spec), make_profile(next_day(spec))
    assert next_day(spec).day == spec.day + dt.timedelta(days=1)
    assert today.tools == tomorrow.tools
    cut = today.system_prompt.rindex("Conversation started:")
    assert today.system_prompt[:cut] == tomorrow.system_prompt[:cut]
    assert today.system_prompt != tomorrow.system_prompt


def test_mixed_workload_spans_workspaces_days_and_turns() -> None:
    """50 sessions over workspaces x days distinct prefixes; later turns resend the history."""
    plans = mixed_workload(50, prefix_chars=4_000, workspaces=3, days=2, max_turns=3)
    assert len(plans) == 50
    assert len({(p.spec.workspace, p.spec.day) for p in plans}) == 6
    assert {len(p.questions) for p in plans} == {1, 2, 3}
    assert mixed_workload(50, prefix_chars=4_000) == mixed_workload(50, prefix_chars=4_000)  # seeded
    multi = next(p for p in plans if len(p.questions) == 3)
    bodies = multi.requests("m")
    assert [len(b["messages"]) for b in bodies] == [2, 4, 6]
    assert bodies[2]["messages"][:4] == bodies[1]["messages"]  # the whole earlier turn is resent
    assert bodies[1]["messages"][2] == {"role": "assistant", "content": multi.answers[0]}

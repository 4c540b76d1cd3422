"""The generator's three layouts: where the date sits, and what a next day or another session changes."""

from __future__ import annotations

import dataclasses

import pytest

from llamafleet_testbed.workload import (
    LAYOUTS,
    WorkloadSpec,
    make_profile,
    mixed_workload,
    next_day,
    session_id,
)

SIZE = 6_000


def _changed(a: str, b: str) -> list[int]:
    """The numbers of the lines that differ between two prompts of the same line count."""
    la, lb = a.splitlines(), b.splitlines()
    assert len(la) == len(lb)
    return [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]


def test_the_default_layout_ends_with_the_date_and_a_next_day_changes_only_it() -> None:
    spec = WorkloadSpec(prefix_chars=SIZE)
    assert spec.layout == "date_last"
    day1, day2 = make_profile(spec).system_prompt, make_profile(next_day(spec)).system_prompt
    assert day1.rsplit("\n\n", 1)[-1] == "Conversation started: Monday, November 2, 2026"
    assert day1.rsplit("\n\n", 1)[0].endswith("</workspace>")
    lines = day1.splitlines()
    assert _changed(day1, day2) == [len(lines) - 1]
    assert day2.splitlines()[-1] == "Conversation started: Tuesday, November 3, 2026"


def test_env_after_date_puts_an_environment_block_after_the_date_line() -> None:
    spec = WorkloadSpec(prefix_chars=SIZE, layout="env_after_date")
    day1, day2 = make_profile(spec).system_prompt, make_profile(next_day(spec)).system_prompt
    started, env = day1.split("\n\n")[-2:]
    assert started == "Conversation started: Monday, November 2, 2026"
    lines = env.splitlines()
    assert lines[0] == "<env>" and lines[-1] == "</env>" and len(lines) >= 6
    assert f"Working directory: {spec.workspace}" in lines and "Git branch: main" in lines
    assert {line.split(":")[0] for line in lines} >= {"OS", "Shell", "Git status"}
    # Only the date line differs, and the whole environment block follows it.
    date_line = day1.splitlines().index(started)
    assert _changed(day1, day2) == [date_line]
    assert day1.splitlines()[date_line + 2:] == lines
    assert len(day1.splitlines()) - date_line == len(lines) + 2


def test_session_after_date_adds_a_seeded_session_id_that_differs_per_session_and_day() -> None:
    spec = WorkloadSpec(prefix_chars=SIZE, layout="session_after_date")
    one = make_profile(spec).system_prompt
    again = make_profile(dataclasses.replace(spec)).system_prompt
    other = make_profile(dataclasses.replace(spec, session=1)).system_prompt
    tomorrow = make_profile(next_day(spec)).system_prompt
    assert one == again  # seeded: the same spec, the same id
    assert one.splitlines()[-2] == "Conversation started: Monday, November 2, 2026"
    assert one.splitlines()[-1] == f"Session ID: {session_id(spec)}"

    last = len(one.splitlines()) - 1
    assert _changed(one, other) == [last]  # same day: only the id, after the date line
    assert _changed(one, tomorrow) == [last - 1, last]  # next day: the date line and the id
    assert len({session_id(dataclasses.replace(spec, session=i)) for i in range(50)}) == 50


def test_layouts_share_the_tools_and_the_text_before_their_closing_blocks() -> None:
    profiles = {layout: make_profile(WorkloadSpec(prefix_chars=SIZE, layout=layout)) for layout in LAYOUTS}
    tools = [p.tools for p in profiles.values()]
    assert all(t == tools[0] for t in tools)
    bodies = {p.system_prompt.split("\n\n<workspace>")[0].split("\n\nConversation started:")[0]
              for p in profiles.values()}
    assert len(bodies) == 1


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout"):
        WorkloadSpec(layout="date_first")


def test_mixed_workload_gives_every_session_its_own_id() -> None:
    base = WorkloadSpec(layout="session_after_date")
    plans = mixed_workload(12, prefix_chars=3_000, workspaces=2, days=2, max_turns=1, base=base)
    systems = [p.requests("m")[0]["messages"][0]["content"] for p in plans]
    assert len(set(systems)) == 12
    plain = mixed_workload(12, prefix_chars=3_000, workspaces=2, days=2, max_turns=1)
    assert len({p.requests("m")[0]["messages"][0]["content"] for p in plain}) == 4

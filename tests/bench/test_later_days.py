"""The real client's rows (bench/later_days.py): ratios and the table from a run's raw figures."""

from __future__ import annotations

from typing import Any

from llamafleet_testbed.bench.later_days import day_body
from llamafleet_testbed.bench.later_days_report import markdown, ratios


def _days(*ttfts: float) -> dict[str, Any]:
    return {f"day{i + 1}": {"ttft_s": t} for i, t in enumerate(ttfts)}


RAW: dict[str, Any] = {"models": {"tiny-hybrid": {
    "plain_same_flags": _days(1.2, 1.4, 1.3), "plain_fa_on": _days(1.1, 1.0, 1.0),
    "fleet_pods_restarted": _days(1.26, 0.1, 0.07), "fleet_whole_restarted": _days(1.3, 0.14, 0.065),
    "third_session": {"plain": [{"ttft_s": 1.0}] * 2 + [{"ttft_s": 1.5}],
                      "fleet": [{"ttft_s": 1.2}] * 2 + [{"ttft_s": 0.05}]},
}}}


def test_ratios_are_plain_over_fleet_and_the_first_session_fleet_over_plain() -> None:
    got = ratios(RAW)["tiny-hybrid"]
    assert got["day2_pods_restarted"] == 14.0 and got["day3_whole_restarted"] == 20.0
    assert got["first_session_vs_same_flags"] == 1.05  # the fleet's first session costs 5% more
    assert got["third_session"] == 30.0


def test_the_table_has_every_row_with_its_ratio() -> None:
    text = markdown(RAW)
    assert "| a day-2 session after day 1, pods restarted | 1.400 s | 0.100 s | 14.0x |" in text
    assert "whole fleet restarted each day | 1.300 s | 0.065 s | 20.0x |" in text
    assert "3rd concurrent session" in text and "flash attention on against" in text


def test_day_bodies_are_the_real_clients_layout_and_differ_only_at_the_date_and_question() -> None:
    one, two = day_body("m", 0, "/home/dev/p"), day_body("m", 1, "/home/dev/p")
    assert len(one["tools"]) == 18 and one["tools"] == two["tools"]
    s1, s2 = one["messages"][0]["content"], two["messages"][0]["content"]
    cut = next(i for i, (a, b) in enumerate(zip(s1, s2, strict=False)) if a != b)
    assert s1[:cut].endswith("Conversation started: ") or "Conversation started" in s1[cut - 40:cut]
    assert one["max_tokens"] == 24 and one["stream"] is True and one["temperature"] == 0


def test_the_first_session_row_takes_the_median_of_the_alternated_rounds() -> None:
    raw = {"models": {"m": {**RAW["models"]["tiny-hybrid"], "first_sessions": {
        "plain_same_flags": [{"ttft_s": t} for t in (1.0, 3.0, 1.2)],
        "plain_fa_on": [{"ttft_s": t} for t in (0.9, 0.8, 5.0)],
        "fleet": [{"ttft_s": t} for t in (1.1, 1.3, 9.0)]}}}}
    got = ratios(raw)["m"]
    assert got["first_session_vs_same_flags"] == round(1.3 / 1.2, 2)
    assert got["first_session_fa_on_vs_same_flags"] == round(0.9 / 1.2, 2)
    assert "| 1.200 s | 1.300 s | 0.9x |" in markdown(raw)  # plain over fleet, as every row


def test_greedy_agreement_counts_the_fleets_days_against_plain_with_the_same_flags() -> None:
    """Every fleet day's output against plain's same day: a missing piece counts as a difference; a run
    that kept no pieces (older JSON) has no agreement row."""
    def days(*outputs: list[str]) -> dict[str, Any]:
        return {f"day{i + 1}": {"ttft_s": 1.0, "pieces": out} for i, out in enumerate(outputs)}

    run = {**RAW["models"]["tiny-hybrid"], "plain_same_flags": days(["a", "b"], ["c", "d"], ["e", "f"]),
           "fleet_pods_restarted": days(["a", "b"], ["c", "d"], ["e", "f"]),
           "fleet_whole_restarted": days(["a", "b"], ["c", "x"], ["e"])}
    got = ratios({"models": {"m": run}})["m"]
    assert got["agreement"] == round(10 / 12, 4)  # 2 of 12 positions differ: one piece, one missing
    assert "| greedy output positions equal to plain's" in markdown({"models": {"m": run}})
    assert "agreement" not in ratios(RAW)["tiny-hybrid"] and "greedy" not in markdown(RAW)


def test_a_new_head_differs_at_its_start_whether_or_not_the_template_writes_tools() -> None:
    from llamafleet_testbed.bench.later_days import new_head_body

    one, two = new_head_body("m", "a-0"), new_head_body("m", "a-1")
    assert one["tools"][0] != two["tools"][0] and one["tools"][1:] == two["tools"][1:]
    systems = [body["messages"][0]["content"] for body in (one, two)]
    assert systems[0].startswith("[a-0] ") and systems[1].startswith("[a-1] ")

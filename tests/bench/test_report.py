"""The seed table from raw results: third-session TTFT ratios, growth, tokens against the minimum,
agreement only against cold reference replies, and the targets marked reached or missed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llamafleet_testbed.bench import report
from llamafleet_testbed.bench.cli import write


def reply(ttft: float, *, cache_n: int = 0, prompt_n: int = 14_000, pieces: list[str] | None = None,
          tps: float = 100.0, status: int = 200) -> dict[str, Any]:
    return {"status": status, "ttft_s": ttft, "total_s": ttft + 1, "cache_n": cache_n, "prompt_n": prompt_n,
            "decode_tps": tps, "pieces": pieces if pieces is not None else ["a", "b", "c", "d"],
            "headers": {}, "error": "", "retries": 0}


def setup(third: float, day: float, sizes: dict[str, float], computed: int, *, reused: int = 0,
          pieces: list[str] | None = None) -> dict[str, Any]:
    def run(t: float) -> list[dict[str, Any]]:
        return [reply(2.0), reply(t, cache_n=reused, prompt_n=14_000 - reused, pieces=pieces),
                reply(t, cache_n=reused, prompt_n=14_000 - reused, pieces=pieces)]
    return {
        "as_is": [run(third), run(third * 1.2), run(third * 0.9)],
        "declared": [run(third)],
        "sizes": {s: [run(t)] for s, t in sizes.items()},
        "later_day": [reply(2.0), reply(day, cache_n=reused, pieces=pieces), reply(0.1, cache_n=13_900)],
        "mixed": {"computed": computed, "failed": 0},
        "snapshot_bytes": 3 * 1024 * 1024,
    }


def raw() -> dict[str, Any]:
    return {
        "plan": {"sizes": [14_000, 24_000, 32_000], "repeats": 3}, "started": "now", "seconds": 60.0,
        "models": {"tiny-dense": {
            "minimum_prefill": 10_000, "kv": {"bytes_per_token": 256},
            "setups": {
                "plain": setup(3.0, 2.0, {"24000": 8.0, "32000": 14.0}, 40_000),
                "sglang": setup(3.3, 2.2, {"24000": 8.5, "32000": 15.0}, 38_000),
                "llamafleet": setup(0.2, 0.1, {"24000": 0.21, "32000": 0.22}, 10_500, reused=13_900,
                                    pieces=["a", "b", "c", "x"]),
            }}},
    }


def test_ratios_and_targets_when_llamafleet_is_faster() -> None:
    """(a)/(c) is the baseline's median over llamafleet's; each target is judged on those medians."""
    data = raw()
    summary = report.summarize(data)
    c = summary["tiny-dense"]["llamafleet"]
    assert c["third_as_is"].median == 0.2 and c["third_as_is"].n == 3
    assert round(c["growth"], 2) == 1.1 and round(summary["tiny-dense"]["plain"]["growth"], 2) == 4.67
    assert c["computed_x_min"] == 1.05
    got = {t["figure"]: (round(t["value"], 2), t["reached"]) for t in report.targets(data, summary)}
    assert got["3rd session TTFT: (a)/(c)"] == (15.0, True)
    assert got["later day TTFT: (b)/(c)"] == (22.0, True)
    assert got["llamafleet TTFT 32K / 14K"] == (1.1, True)
    assert got["(a) 3rd session TTFT 32K / 14K"] == (4.67, True)
    assert got["(a) 1st session (cold) TTFT 32K / 14K"] == (1.0, False)  # every 1st session took 2 s here
    assert got["prefill tokens / minimum"] == (1.05, True)
    # sessions 2 and 3 and the later day's first differ at one position in four: 67 of 80 positions
    assert got["greedy agreement with a cold run"] == (0.84, False)


def test_agreement_ignores_reference_replies_that_were_not_cold() -> None:
    """Only replies where (a) computed the whole prompt are a cold reference: the day-2 next session on
    (a) reused its slot, so it is not compared."""
    summary = report.summarize(raw())
    positions = summary["tiny-dense"]["sglang"]["agreement_positions"]
    # 3 + 1 + 2 three-session runs x 3 replies x 4 pieces, plus the later day's first two replies
    assert positions == (6 * 3 + 2) * 4
    assert summary["tiny-dense"]["sglang"]["agreement"] == 1.0


def test_markdown_has_a_row_per_figure_and_both_ratio_columns() -> None:
    data = raw()
    text = report.markdown(data, report.summarize(data))
    assert "| 3rd concurrent session TTFT, prompts as they are | 3.000 s (2.700-3.600) |" in text
    assert "(a) / (c) | (b) / (c) |" in text
    first = "| 3rd concurrent session TTFT, prompts"
    row = next(line for line in text.splitlines() if line.startswith(first))
    assert row.rstrip(" |").endswith("15.0x | 16.5x")


def test_write_produces_table_json_and_plots(tmp_path: Path) -> None:
    """One call writes the markdown, the JSON (raw plus summary and targets) and both PNGs."""
    text = write(raw(), tmp_path)
    assert "Targets:" in text
    saved = json.loads((tmp_path / "seed_table.json").read_text())
    assert saved["summary"]["tiny-dense"]["llamafleet"]["third_as_is"]["median"] == 0.2
    assert len(saved["targets"]) == 9
    for name in ("seed_table_ttft.png", "seed_table_tokens.png", "seed_table_kv.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_reliability_is_the_reliability_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`llamafleet bench reliability` (the issue's name) reaches the fault scenarios' command."""
    from llamafleet_testbed.bench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["reliability", "--help"])
    assert exit_.value.code == 0 and "llamafleet reliability" in capsys.readouterr().out


def test_the_fleet_agrees_with_its_own_cold_reference_when_one_was_run() -> None:
    """With a cold reference (the fleet's own server flags, run.cold_reference), the fleet's replies
    compare with it, scenario by scenario, not with (a); the sizes it left out are not compared, and
    the baselines still compare with (a)."""
    data = raw()
    fleet = data["models"]["tiny-dense"]["setups"]["llamafleet"]
    # Cold replies equal to what the fleet answered, where (a) differs (other arithmetic).
    def cold(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [reply(5.0, pieces=r["pieces"]) for r in run]
    data["models"]["tiny-dense"]["reference"] = {
        "as_is": [cold(run) for run in fleet["as_is"]], "declared": [cold(run) for run in fleet["declared"]],
        "later_day": cold(fleet["later_day"])}
    summary = report.summarize(data)["tiny-dense"]
    assert summary["llamafleet"]["agreement"] == 1.0
    # (3 + 1) three-session runs x 3 replies and the later day's 3, 4 pieces each: no sizes
    assert summary["llamafleet"]["agreement_positions"] == (4 * 3 + 3) * 4
    sglang = summary["sglang"]
    assert sglang["agreement"] == 1.0 and sglang["agreement_positions"] == (6 * 3 + 2) * 4
    del data["models"]["tiny-dense"]["reference"]
    assert report.summarize(data)["tiny-dense"]["llamafleet"]["agreement"] < 1.0  # (a) it is, then


def test_patched_pods_get_their_own_column_ratios_and_targets() -> None:
    """Setup (d), llamafleet on patched pods: a column of its own, (a)/(d) and (b)/(d) beside the
    (c) ratios, and issue 21's figures judged on its medians."""
    data = raw()
    data["models"]["tiny-dense"]["setups"]["patched"] = setup(
        0.05, 0.1, {"24000": 0.06, "32000": 0.07}, 10_400, reused=13_900)
    summary = report.summarize(data)
    table = report.markdown(data, summary)
    assert "(d) llamafleet, patched pods" in table and "(a) / (d) | (b) / (d)" in table
    rows = table.splitlines()
    third = next(line for line in rows if line.startswith("| 3rd concurrent session TTFT, prompts"))
    assert third.rstrip(" |").split(" | ")[-2:] == ["60.0x", "66.0x"]  # (a)/(d), (b)/(d)
    got = {t["figure"]: (round(t["value"], 2), t["reached"]) for t in report.targets(data, summary)}
    assert got["3rd session TTFT: (a)/(d)"] == (60.0, True)
    assert got["later day after a restart, from disk: (a)/(d)"] == (20.0, True)
    assert got["(d) prefill tokens / minimum"] == (1.04, True)


def test_later_day_from_ram_kv_memory_and_decode_with_three_sessions_come_from_their_scenarios() -> None:
    """The rows of the scenarios that run after the mixed workload: the later day from RAM (TTFT of the
    first day-2 session), KV memory per session from the cells the servers say they hold with three
    sessions at once, and those sessions' decode speed; (d)'s targets judged against (a) and (c)."""
    data = raw()
    setups = data["models"]["tiny-dense"]["setups"]
    setups["patched"] = setup(0.05, 0.1, {"24000": 0.06, "32000": 0.07}, 10_400, reused=13_900)
    for kind, first, cells, tps in (("plain", 4.0, 3 * 14_100, 100.0), ("llamafleet", 0.3, 3 * 14_100, 100.0),
                                    ("patched", 0.1, 14_000 + 3 * 100, 125.0)):
        setups[kind]["later_day_ram"] = [reply(2.0), reply(first), reply(0.1)]
        source = "slots" if kind != "patched" else "kv_cells_used"
        # each turn of history adds 80 tokens to every session's prompt and to the servers' count
        setups[kind]["kv_by_history"] = [
            {"history_turns": turns, "source": source, "cells": cells + 3 * turns * 80,
             "replies": [reply(1.0, tps=tps, cache_n=14_000, prompt_n=100 + turns * 80) for _ in range(3)]}
            for turns in (0, 20)]
    summary = report.summarize(data)
    d = summary["tiny-dense"]["patched"]
    assert d["kv_three_mib"].median == (14_000 + 300) * 256 / 3 / report.MIB
    assert summary["tiny-dense"]["sglang"]["kv_three_mib"].n == 0  # a setup without the scenario: none
    history, mib = d["kv_by_history"][1]
    assert history == 1_600 and mib == (14_300 + 3 * 1_600) * 256 / 3 / report.MIB
    got = {t["figure"]: (round(t["value"], 2), t["reached"]) for t in report.targets(data, summary)}
    assert got["later day from RAM: (a)/(d)"] == (40.0, True)
    assert got["KV memory per session, 3 sessions: (d)/(c)"] == (0.34, True)
    assert got["decode tokens/s, 3 sessions: (d)/(c)"] == (1.25, True)
    table = report.markdown(data, summary)
    row = next(line for line in table.splitlines() if line.startswith("| later day from RAM (no restart"))
    assert "0.100 s" in row and "40.0x" in row
    assert any(line.startswith("| KV memory per session, 3 sessions at once") for line in table.splitlines())

"""Restore times and snapshot sizes for the seed table, from the gateway's own JSON log (pure)."""

from __future__ import annotations

import json

from llamafleet_testbed.bench.stats import restore_figures, restore_records


def _event(name: str, tokens: int, source: str, restore_ms: float, seconds: float) -> str:
    return json.dumps({"ts": "t", "level": "info", "msg": "snapshot restored", "snapshot": name,
                       "n_tokens": tokens, "source": source, "restore_ms": restore_ms, "seconds": seconds})


def test_restores_near_the_headline_size_give_file_size_and_both_times() -> None:
    """Only local restores of about the headline size count (a pull's time is another figure, and a
    2.6K-token head restores faster than a 14K-token one); other log lines and bad JSON are skipped."""
    lines = [
        _event("fs-a", 14_000, "local", 10.0, 0.020),
        _event("fs-b", 13_500, "local", 14.0, 0.030),
        _event("fs-c", 14_100, "peer", 11.0, 0.090),
        _event("fs-d", 2_600, "local", 2.0, 0.010),
        json.dumps({"msg": "request finished", "seconds": 9.0}),
        '{"msg": "snapshot restored", broken',
    ]
    records = restore_records(lines)
    assert [r["snapshot"] for r in records] == ["fs-a", "fs-b", "fs-c", "fs-d"]
    files = [{"pod": "p", "name": f"fs-{x}.bin", "bytes": 3 * 1024 * 1024 + i} for i, x in enumerate("abcd")]
    got = restore_figures(records, files, 14_000)
    assert (got["server_ms"].median, got["server_ms"].n) == (12.0, 2)
    assert got["gateway_ms"].median == 25.0
    assert round(got["mib"].median, 3) == 3.0 and got["mib"].n == 2
    assert restore_figures([], [], 14_000)["server_ms"].fmt() == "n/a"

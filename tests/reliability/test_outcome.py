"""The figures' table and JSON (pure): the table is made of the JSON's own fields, column by column."""

from __future__ import annotations

from llamafleet_testbed.reliability.outcome import COLUMNS, ScenarioResult, report, table


def _rows(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


def test_the_table_shows_streams_cut_and_purge_time_from_the_json_fields() -> None:
    """The kill scenario's streams cut / with an error event and seconds until the dead pod's entries
    were purged are columns of the table and fields of the JSON; scenarios without them show `-`."""
    killed = ScenarioResult("kill -9 llama-server", "SIGKILL", sent=20, succeeded=19, failed=1,
                            streams_cut=2, streams_cut_with_error_event=1, purged_after_s=0.24, seconds=18.7)
    killed.expect(False, "a stream cut by the kill ended without an SSE error event")
    redis = ScenarioResult("kill -9 Redis", "SIGKILL", sent=5, succeeded=5, seconds=6.0)
    data = report([killed, redis], {"when": "now"})["scenarios"]
    rows = _rows(table([killed, redis]))

    assert (data[0]["streams_cut"], data[0]["streams_cut_with_error_event"], data[0]["purged_after_s"]) == (
        2, 1, 0.24)
    assert rows[0]["streams cut / with error event"] == "2 / 1"
    assert rows[0]["entries purged after s"] == "0.2"
    assert rows[0]["invariants"] == "BROKEN: a stream cut by the kill ended without an SSE error event"
    assert rows[1]["streams cut / with error event"] == "-" and rows[1]["entries purged after s"] == "-"
    assert (rows[1]["sent"], rows[1]["seconds"], rows[1]["invariants"]) == ("5", "6.0", "held")
    # Every column names fields the JSON holds: neither can drift from the other.
    assert all(f in data[0] for _, fields in COLUMNS for f in fields)

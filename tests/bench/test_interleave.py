"""The seed table's headline runs interleave over the setups (`run.run_as_is`): repeat r runs on every
setup, in an order rotated by r, before repeat r + 1. Checked with stand-in setups and sessions: the
order is the harness's own logic, not llama-server's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from llamafleet_testbed.bench import plan, run
from llamafleet_testbed.bench.client import Reply


async def test_repeats_interleave_over_setups_in_rotated_order(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []

    async def three_sessions(http: Any, url: str, profile: Any, model: str, key: str) -> list[Reply]:
        calls.append((url, key))
        return [Reply(status=200, ttft_s=float(len(calls)), total_s=1.0)] * 3

    monkeypatch.setattr(run.sc, "three_sessions", three_sessions)
    setups: dict[str, Any] = {k: SimpleNamespace(url=k) for k in ("plain", "sglang", "llamafleet")}
    profiles = plan.Profiles(chars={}, as_is=[object(), object(), object()])  # type: ignore[list-item]
    said: list[str] = []
    out = await run.run_as_is(setups, "m", profiles, said.append)
    assert calls == [("plain", "as-is/0"), ("sglang", "as-is/0"), ("llamafleet", "as-is/0"),
                     ("sglang", "as-is/1"), ("llamafleet", "as-is/1"), ("plain", "as-is/1"),
                     ("llamafleet", "as-is/2"), ("plain", "as-is/2"), ("sglang", "as-is/2")]
    assert [len(out[k]) for k in setups] == [3, 3, 3]
    assert [run_[2]["ttft_s"] for run_ in out["llamafleet"]] == [3.0, 5.0, 7.0]
    assert len(said) == 9

"""One small real run of the seed-table harness: plain llama-server, a local fleet on upstream pods and
one on patched pods, tiny prefixes.

It checks the harness measures what it claims on real servers: TTFT at the first content event, the
fleet's 2nd and 3rd concurrent sessions served from the first one's snapshot (nearly all of the prompt
reused, where the plain server recomputes it), tokens computed counted from the servers' own metrics,
greedy outputs equal to the plain server's cold ones, and the KV cells three sessions at once hold as
the servers count them: every slot its own copy upstream, the head once on patched pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamafleet_testbed.bench import report
from llamafleet_testbed.bench.plan import Plan
from llamafleet_testbed.bench.run import run_model

pytestmark = [pytest.mark.llama]

SMOKE = Plan(models=("tiny-hybrid",), repeats=1, sizes=(1_500, 3_000), size_repeats=1, mixed_sessions=6,
             mixed_prefix_chars=6_000, setups=("plain", "llamafleet", "patched"))


async def test_harness_measures_reuse_and_agreement_when_run_against_real_servers(tmp_path: Path) -> None:
    """The fleet's 3rd session reuses >= 90% of its prompt, the plain server's ~none; every request
    succeeds; tokens computed are counted; outputs agree with the cold run."""
    raw: dict[str, Any] = {"plan": {"sizes": list(SMOKE.sizes), "repeats": 1}, "started": "", "seconds": 0.0,
           "models": {"tiny-hybrid": await run_model("tiny-hybrid", SMOKE, tmp_path, lambda _: None)}}
    result = raw["models"]["tiny-hybrid"]
    assert abs(result["calibration"]["1500"]["tokens"] - 1_500) <= 60, result["calibration"]
    plain, fleet, patched = (result["setups"][k] for k in ("plain", "llamafleet", "patched"))
    for setup in (plain, fleet, patched):
        replies = [r for run in setup["as_is"] + setup["declared"] for r in run] + setup["later_day"]
        replies += setup["later_day_ram"] + [r for run in setup["kv_by_history"] for r in run["replies"]]
        assert all(r["status"] == 200 and r["pieces"] for r in replies), [r["error"] for r in replies]
        assert setup["mixed"]["failed"] == 0 and setup["mixed"]["computed"] > 0
    upstream, shared = fleet["kv_by_history"][0], patched["kv_by_history"][0]
    prompt = sum(upstream["replies"][0][k] for k in ("cache_n", "prompt_n"))
    head = upstream["replies"][0]["cache_n"]  # restored: the shared head
    assert upstream["source"] == "slots" and upstream["cells"] >= 3 * prompt
    # two of the three sessions share a pod (there are two): there the patched server holds the head once
    assert shared["source"] == "kv_cells_used"
    assert shared["cells"] <= upstream["cells"] - 0.8 * head, (shared, upstream)
    # with history, each session's own turns are held on both, beside the head
    for runs in (fleet["kv_by_history"], patched["kv_by_history"]):
        history = sum(r["cache_n"] + r["prompt_n"] for r in runs[-1]["replies"]) - 3 * prompt
        assert runs[-1]["cells"] - runs[0]["cells"] >= 0.8 * history > 0, runs
    third = fleet["as_is"][0][2]
    # It reuses the prefix through a restore, or through a slot that holds it (timing decides which).
    action = third["headers"]["x-llamafleet-action"]
    assert action.startswith(("restore/", "direct/slot_hit")), third["headers"]
    assert third["cache_n"] >= 0.9 * (third["cache_n"] + third["prompt_n"])
    assert plain["as_is"][0][2]["cache_n"] <= 0.05 * plain["as_is"][0][2]["prompt_n"]
    assert fleet["declared"][0][0]["cache_n"] > 0  # the declared SharedPrefix was warm before session 1
    summary = report.summarize(raw)
    assert summary["tiny-hybrid"]["llamafleet"]["agreement"] >= 0.99
    assert result["minimum_prefill"] < plain["mixed"]["computed"] + fleet["mixed"]["computed"]
    assert "| 3rd concurrent session TTFT" in report.markdown(raw, summary)

"""The fleet simulator (testbed/fleet_sim): its server model, its traffic, and a small run through the
real scheduler and index (in memory, and on a real Redis through `llamafleet bench simulate`)."""

from __future__ import annotations

import gc
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core.index import InMemoryPrefixIndex, InMemorySlotLeases
from llamafleet_router.cli import loop_factory
from llamafleet_testbed.bench.cli import main as bench_main
from llamafleet_testbed.fleet_sim import report
from llamafleet_testbed.fleet_sim.run import FleetSim, FleetSpec, Tally
from llamafleet_testbed.fleet_sim.servers import ServerTiming, SimPod, shared_blocks
from llamafleet_testbed.fleet_sim.traffic import Arrivals, TrafficSpec, real_ranks, zipf_cumulative

TIMING = ServerTiming(prefill_tokens_per_s=1000.0, decode_tokens_per_s=10.0, floor_s=0.0, chars_per_token=4.0)


def test_a_slot_reuses_the_blocks_its_last_prompt_shares_and_a_busy_one_queues() -> None:
    assert shared_blocks(("a", "b", "c"), ("a", "b", "x", "y")) == 2 and shared_blocks((), ("a",)) == 0
    pod = SimPod("p", 2)
    first = pod.serve(0, ("a", "b"), 2048, 10, 0.0, TIMING, block_chars=256)
    assert (first.cached_tokens, first.computed_tokens) == (0, 512)
    assert first.done_at == pytest.approx(512 / 1000 + 10 / 10)
    # the next turn extends it: two blocks (128 tokens) reused; sent while busy, it starts when free
    second = pod.serve(0, ("a", "b", "c"), 3072, 10, 0.5, TIMING, block_chars=256)
    assert (second.cached_tokens, second.computed_tokens) == (128, 640)
    assert second.done_at == pytest.approx(first.done_at + 640 / 1000 + 1.0)
    assert pod.busy(first.done_at) == frozenset({0}) and pod.busy(second.done_at) == frozenset()


def test_the_traffic_is_a_zipf_mix_with_the_real_client_spread_over_it() -> None:
    weights = zipf_cumulative(5, 1.0)
    assert weights == pytest.approx([1, 1.5, 1.5 + 1 / 3, 1.5 + 1 / 3 + 0.25, 1.5 + 1 / 3 + 0.25 + 0.2])
    ranks = real_ranks(200, 0.5)
    assert len(ranks) == 100 and len(ranks & set(range(20))) == 10  # the most popular hold both kinds
    spec = TrafficSpec(prefixes=50, seed=4)
    one, two = Arrivals(spec), Arrivals(spec)
    sessions = [one.session() for _ in range(2000)]
    assert [(s.prefix, s.turns_left) for s in sessions[:50]] == [
        (s.prefix, s.turns_left) for s in (two.session() for _ in range(50))]
    popular = sum(s.prefix == 0 for s in sessions) / len(sessions)
    assert popular > 5 * sum(s.prefix == 49 for s in sessions) / len(sessions)
    assert statistics.mean(s.turns_left for s in sessions) == pytest.approx(spec.mean_turns, rel=0.1)


@pytest.mark.models
async def test_a_small_fleet_runs_through_the_real_scheduler_and_index() -> None:
    """Sessions' later turns find their slots (slot hits), nothing is computed below the least any
    placement could, leaving pods are purged, and every request got one decision."""
    index, leases = InMemoryPrefixIndex(), InMemorySlotLeases()
    sim = FleetSim(FleetSpec(pods=6, slots=2, minutes=1.0, churn_per_hour=240.0),
                   TrafficSpec(sessions_per_hour=3000.0, prefixes=6, mean_think_s=5.0), TIMING,
                   index=index, leases=leases, template=report.qwen_template())
    tally: Tally = await sim.run()
    assert tally.sessions > 20 and len(tally.decision_ms) >= tally.sessions
    assert tally.branches["slot_hit"] > 0 and tally.pods_replaced > 0 and len(sim.pods) == 6
    assert tally.computed_tokens >= tally.minimum_tokens > 0
    assert set(sim.statuses) == set(sim.pods)  # each pod the simulator runs is one the scheduler sees
    # the pods that left hold no slot entry (purged as discovery's fence purges them)
    held = {ref.pod_uid for ref in index._slots.get("sim", {})}
    assert held and held <= set(sim.pods)


def test_the_figures_divide_by_requests_and_compare_with_the_minimum() -> None:
    tally = Tally(decision_ms=[1.0, 2.0, 3.0, 4.0], computed_tokens=300, minimum_tokens=100, sessions=2)
    before = {"total_commands_processed": 10, "total_net_input_bytes": 0, "total_net_output_bytes": 0,
              "used_memory": 1000}
    after = {"total_commands_processed": 410, "total_net_input_bytes": 4000, "total_net_output_bytes": 800,
             "used_memory": 1000 + 2**20}
    out = report.figures(tally, before, after, keys=50, live_slots=2, wall_s=2.0, round_trips=20)
    assert (out["decision_p50_ms"], out["decision_p99_ms"]) == (2.5, 4.0)
    assert (out["redis_round_trips_per_request"], out["redis_commands_per_request"]) == (5.0, 100.0)
    assert out["redis_bytes_in_per_request"] == 1000.0 and out["index_ops_per_s"] == 10.0
    assert out["redis_memory_per_1000_slot_entries_mib"] == pytest.approx(500.0)
    assert out["prefill_over_minimum"] == 3.0


@pytest.mark.models
@pytest.mark.redis
def test_bench_simulate_writes_its_figures_from_a_real_redis(tmp_path: Path) -> None:
    """A request costs the gateway's five round trips (lookup, lease, the two slot records, the release;
    a queued request takes no lease), plus, in so short a run, each script's first load (NOSCRIPT, then
    EVAL) and the purges of the pods that left."""
    collector = gc.get_threshold()
    assert bench_main(["simulate", "--pods", "8", "--slots", "2", "--minutes", "0.5", "--sessions-per-hour",
                       "2000", "--prefixes", "4", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "fleet_sim_8x2.json").read_text())["result"]
    # Timed under the gateway's collector policy (cli.freeze_heap), and the process's own given back.
    assert data["frozen_objects"] > 1000
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == collector
    assert data["requests"] > 0 and 3.0 <= data["redis_round_trips_per_request"] <= 6.0
    assert data["redis_memory_bytes"] > 0 and data["live_slot_entries"] > 0
    # decided on the gateway's own event loop, and the collector's share of the decisions counted
    assert data["event_loop"] == ("asyncio" if loop_factory() is None else "uvloop")
    assert 0 <= data["collections_in_decisions"] <= data["collections"]
    assert "decision p50 / p99" in (tmp_path / "fleet_sim_8x2.md").read_text()


@pytest.mark.models
async def test_the_collections_inside_decisions_are_counted_apart() -> None:
    """A collection that runs inside a timed decision is charged to the decisions; one between them
    only to the run."""
    sim = FleetSim(FleetSpec(pods=4, slots=2, minutes=0.2, churn_per_hour=0.0),
                   TrafficSpec(sessions_per_hour=3000.0, prefixes=2), TIMING,
                   index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(), template=report.qwen_template())
    schedule = sim.scheduler.schedule

    async def collecting(*args: Any, **kwargs: Any) -> Any:
        gc.collect(0)
        return await schedule(*args, **kwargs)

    sim.scheduler.schedule = collecting  # type: ignore[method-assign]
    done = sim._done

    async def done_collecting(*args: Any) -> None:
        gc.collect(0)
        await done(*args)

    sim._done = done_collecting  # type: ignore[method-assign]
    tally = await sim.run()
    decisions = len(tally.decision_ms)
    assert decisions > 0 and tally.collections_in_decisions >= decisions
    assert tally.collections >= tally.collections_in_decisions + 1  # those after the answers too
    assert tally.collection_ms_in_decisions > 0

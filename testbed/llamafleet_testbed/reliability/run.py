"""The scenarios by name, each on a fleet of its own, and the whole suite as one report."""

from __future__ import annotations

import platform
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from llamafleet_testbed.reliability.bed import Bed, running_fleet
from llamafleet_testbed.reliability.faults import hang_pod, kill_redis, kill_server
from llamafleet_testbed.reliability.outcome import ScenarioResult
from llamafleet_testbed.reliability.replicas import kill_gateway
from llamafleet_testbed.reliability.snapshots import bad_snapshots, kill_agent

Scenario = Callable[[Bed], Awaitable[ScenarioResult]]

# Table order: the order.
SCENARIOS: dict[str, Scenario] = {
    "kill-server": kill_server,
    "kill-agent": kill_agent,
    "kill-redis": kill_redis,
    "kill-gateway": kill_gateway,
    "hang-pod": hang_pod,
    "bad-snapshots": bad_snapshots,
}


async def run_scenario(name: str, run_dir: Path, binary: Path | None = None) -> ScenarioResult:
    """One scenario on a fresh fleet (its own pods, Redis and gateway under `run_dir`)."""
    async with running_fleet(binary, run_dir) as bed:
        return await SCENARIOS[name](bed)


async def run_all(names: Sequence[str], run_dir: Path, binary: Path | None = None,
                  progress: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    results = []
    for name in names:
        result = await run_scenario(name, run_dir / name, binary)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def meta() -> dict[str, Any]:
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.machine(),
            "python": platform.python_version(),
            "fleet": "llamafleet up: 2 pods x 2 slots, tiny-dense, 1 thread each, embedded Redis"}

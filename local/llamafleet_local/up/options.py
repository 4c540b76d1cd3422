"""What one `up` run is asked for (`UpOptions`), set by the command line or by code embedding a fleet.

Apart from the runtime because the command (`cli.py`) builds these without starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EMBEDDED = "embedded"


@dataclass
class UpOptions:
    port: int = 8000  # 0: any free port (tests, benchmarks)
    index: str = EMBEDDED  # "embedded" (a private redis-server), "memory", or a redis:// URL
    run_dir: Path | None = None  # default: runs/<timestamp>/ under the current directory
    restart: bool = True  # restart a pod whose process died, and warm it again
    max_restarts: int = 3  # per pod; beyond that the fleet gives up (exit non-zero)
    restart_delay: float = 0.0  # seconds a dead pod stays down before it is started again
    pod_timeout: float = 180.0  # seconds for one pod to load its model and answer
    # Where the pods keep their snapshots (`state.py`): `state_dir` when given; else, with
    # `keep_snapshots` (the `up` command's default), `<cache>/state/<fleet>-<model digest>`, which
    # outlives the run; else the run folder, so an embedding run (tests, benchmarks) starts cold.
    keep_snapshots: bool = False
    state_dir: Path | None = None

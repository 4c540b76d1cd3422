"""The run folder of `llamafleet up`: new at every start, it holds what the run hands its processes
and the record of what it started.

Apart from the runtime because what is written here is read from outside the run: the agents read
their secrets from files (0600, never a command line), and `state.json` (pids and exact argv) is what
a test or a person checks for processes left behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet_core.index.resp import redacted_url

if TYPE_CHECKING:
    from llamafleet_local.up.runtime import LocalFleet


def default_run_dir(base: Path) -> Path:
    return base / "runs" / time.strftime("%Y%m%d-%H%M%S")


def write_secret(path: Path, secret: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret)


def write_state(fleet: LocalFleet) -> None:
    """`state.json`: everything `fleet` started so far; rewritten whenever that changes."""
    children = [c for p in fleet.pods for c in (p.server, p.agent)]
    state = {
        "pid": os.getpid(),
        "gateway": fleet.gateway_url,
        "state_dir": str(fleet.state_dir) if fleet.state_dir else None,
        "index": redacted_url(fleet.index.redis_url) if fleet.index and fleet.index.redis_url else None,
        "model": str(fleet.resolved.model) if fleet.resolved else None,
        "redis": {"pid": fleet.redis.proc.pid if fleet.redis and fleet.redis.proc else None},
        "processes": [{"name": c.name, "pid": c.pid, "argv": c.argv, "log": str(c.log)}
                      for c in children],
    }
    (fleet.run_dir / "state.json").write_text(json.dumps(state, indent=2))

"""Fault injection over `llamafleet up`: reusable scenarios that return counts, and the command.

- `outcome`: what a request's fate was (succeeded, failed, lost) and the per-scenario figures (pure);
- `client`: the bounded steady workload (`Load`) and one request with client-side retries (`send`);
- `bed`: the small fleet the scenarios run on (`running_fleet`), and index/readiness probes;
- `faults`: llama-server SIGKILL, llama-server SIGSTOP/SIGCONT, Redis SIGKILL and restart;
- `replicas`: a second gateway replica SIGKILLed; `snapshots`: agent killed mid-transfer, bad snapshots;
- `link`: a slow link to an agent that goes down with it (what makes a transfer cut half-way);
- `run`: scenarios by name, each on its own fleet; `cli.main`: `llamafleet reliability`.
"""

from llamafleet_testbed.reliability.cli import main
from llamafleet_testbed.reliability.outcome import ScenarioResult, Sent, table
from llamafleet_testbed.reliability.run import SCENARIOS, run_all, run_scenario

__all__ = ["SCENARIOS", "ScenarioResult", "Sent", "main", "run_all", "run_scenario", "table"]

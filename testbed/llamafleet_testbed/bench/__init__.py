"""`llamafleet bench`: the measurements that reproduce the seed table on one machine.

- `workload` (in `llamafleet_testbed.workload`): the agent requests;
- `client`: one streamed request, TTFT at the first content event;
- `setups`: (a) plain llama-server, (b) sglang-router cache-aware over plain pods, (c) `LocalFleet`;
- `scenarios`: three concurrent sessions, later day after restarts, the mixed 50-session workload;
- `plan`: what a run measures and the prefixes it sends; `run`: the whole run;
- `report`: summary, markdown table and ratios (pure); `plots`: PNGs;
- `cli.main`: `llamafleet bench seed-table`.
"""

from llamafleet_testbed.bench.cli import main

__all__ = ["main"]

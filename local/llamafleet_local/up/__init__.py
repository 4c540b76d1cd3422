"""`llamafleet up`: a whole fleet (index, llama-server + agent pods, gateway) as local processes.

- `config`: FLEET.yaml (CRD documents plus `local:`), validated with errors that name the field;
- `resolve`: the model, chat template and llama-server binary those settings name;
- `pods`, `procs`: the processes, with the operator's exact command lines (`llamafleet_core.podspec`);
- `gateway`: the router app in-process, its `/health` gated on "every pod up, every prefix warm";
- `runtime.LocalFleet`: the programmatic API (`async with LocalFleet(config, options) as fleet`), with
  `options.UpOptions`; `run_folder`: the run's secrets and its record of what it started (`state.json`);
- `supervise`: warms the SharedPrefixes, restarts and re-warms a pod whose process died; `progress`:
  what the terminal shows;
- `state`: the state folder, where the pods' snapshots outlive the run (one `up` at a time);
- `shutdown`: the stop, each step bounded, so nothing outlives a SIGTERM by more than seconds;
- `cli.main`: the command.
"""

from llamafleet_local.up.cli import main
from llamafleet_local.up.config import ConfigError, FleetConfig, LocalSettings, load_fleet, parse_documents
from llamafleet_local.up.options import UpOptions
from llamafleet_local.up.runtime import LocalFleet

__all__ = ["ConfigError", "FleetConfig", "LocalFleet", "LocalSettings", "UpOptions", "load_fleet", "main",
           "parse_documents"]

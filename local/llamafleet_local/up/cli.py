"""`llamafleet up -f FLEET.yaml`: run a fleet (index, pods, gateway) as local processes until stopped.

FLEET.yaml holds a `LlamaFleet` document with a top-level `local:` mapping (model: a GGUF file or a
tiny test model name; chatTemplate; llamaServer; threads) and any number of `SharedPrefix` documents,
in the CRDs' schema. Ctrl-C or SIGTERM stops everything `up` started, within 10 seconds, and its
children die with it even when `up` itself is killed (SIGKILL). A pod whose process dies is
restarted (at most --max-restarts times) and warmed again, and gets traffic only once warm (a pod that
cannot be warmed stays out of rotation, and warming is retried); with --no-restart `up` exits 1 instead.
The gateway URL is printed on stdout once the fleet is ready; progress and logs' tails go to stderr,
and every process's log into the run folder.

The pods' snapshots outlive the run: they are kept in a state folder per fleet name and model,
<cache>/state/<fleet>-<first 16 hex digits of the model's sha256> (the cache: $LLAMAFLEET_CACHE, else
~/.cache/llamafleet), or in --state-dir DIR. So the first sessions after a restart of `up` restore the
prefixes of earlier runs instead of computing them. Each agent keeps its folder under the fleet's
snapshot budget (spec.snapshots), least recently used out first. One `up` at a time may use a state
folder (a lock in it); to start afresh, stop `up` and delete the folder.

Exit codes: 0 stopped by a signal, 1 a process failed, 2 a bad FLEET.yaml, bad arguments, or a state
folder another `up` is using.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from llamafleet_local.up.config import ConfigError, load_fleet
from llamafleet_local.up.options import EMBEDDED, UpOptions
from llamafleet_local.up.procs import ChildFailed
from llamafleet_local.up.progress import Reporter
from llamafleet_local.up.runtime import LocalFleet
from llamafleet_local.up.shutdown import bounded
from llamafleet_local.up.state import StateLocked
from llamafleet_local.up.supervise import FleetFailed

LEFTOVER_S = 0.5  # see shutdown.py: the whole stop, this included, stays under 10 s


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamafleet up", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", dest="file", type=Path, required=True, help="the FLEET.yaml")
    p.add_argument("--port", type=int, default=8000, help="gateway port on 127.0.0.1 (0: any free one)")
    p.add_argument("--index", default=EMBEDDED,
                   help="`embedded` (a private redis-server, default), `memory`, or a redis:// URL")
    p.add_argument("--run-dir", type=Path,
                   help="the run folder: logs, state.json (default: runs/<timestamp>/ here)")
    p.add_argument("--state-dir", type=Path,
                   help="the state folder: the pods' snapshots, kept across runs (default: "
                        "<cache>/state/<fleet>-<model digest>); one `up` at a time")
    p.add_argument("--no-restart", dest="restart", action="store_false",
                   help="exit 1 when a process dies instead of restarting its pod")
    p.add_argument("--max-restarts", type=int, default=3, help="restarts per pod before giving up")
    return p


def options(argv: list[str]) -> tuple[Path, UpOptions]:
    args = parser().parse_args(argv)
    if args.index not in (EMBEDDED, "memory") and not args.index.startswith(("redis://", "rediss://")):
        parser().error(f"--index: expected embedded, memory or a redis:// URL, got {args.index!r}")
    if not 0 <= args.port <= 65535:
        parser().error(f"--port: out of range: {args.port}")
    return args.file, UpOptions(port=args.port, index=args.index, run_dir=args.run_dir,
                                restart=args.restart, max_restarts=args.max_restarts,
                                keep_snapshots=True, state_dir=args.state_dir)


async def run(fleet: LocalFleet) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    say = fleet.reporter.say
    starting = asyncio.create_task(fleet.start(), name="start")
    stopping = asyncio.create_task(stop.wait(), name="signal")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            say("stopping (signal during start)")
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            return 0
        starting.result()  # raises what start raised (it stopped everything already)
        print(fleet.gateway_url, flush=True)
        say(f"ready: {fleet.gateway_url} (Ctrl-C to stop)")
        await fleet.run_until(stop)
        say("stopping")
        return 0
    except StateLocked as exc:
        say(f"refused: {exc}")
        return 2
    except (ChildFailed, FleetFailed, OSError, RuntimeError) as exc:
        say(f"failed: {exc}")
        return 1
    finally:
        stopping.cancel()
        await fleet.stop()
        say("stopped")


def main(argv: list[str] | None = None) -> int:
    try:
        path, opts = options(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return int(exc.code or 0)
    try:
        config = load_fleet(path)
    except ConfigError as exc:
        print(f"llamafleet up: {exc}", file=sys.stderr)
        return 2
    return run_bounded(run(LocalFleet(config, opts, Reporter(sys.stderr))))


def run_bounded(main: Coroutine[Any, Any, int], leftover_s: float = LEFTOVER_S) -> int:
    """`asyncio.run(main)`, except that tasks still running once `main` returned get `leftover_s`
    seconds to end after their cancel, not forever. `asyncio.run` waits for every cancelled task, and
    one that swallows its cancel (a gateway task against a pod that died, after the fleet's bounded
    stop gave up on it) would keep `up` from exiting although everything it started is stopped."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=leftover_s))
        for task in left:  # their failures while ending are no news: retrieved, so none is printed
            if task.done() and not task.cancelled():
                task.exception()
        with contextlib.suppress(Exception):
            loop.run_until_complete(bounded(loop.shutdown_asyncgens(), leftover_s))
        asyncio.set_event_loop(None)
        loop.close()


if __name__ == "__main__":
    sys.exit(main())

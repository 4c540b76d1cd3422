"""`llamafleet reliability`: run the fault scenarios and print the table of figures.

Each scenario starts its own small local fleet (2 llama-server pods of 2 slots, the tiny dense model,
an embedded Redis), runs a bounded agent workload over loopback, injects its fault, and counts requests
sent, succeeded, failed, lost (no answer at all) and wrongly restored. The table goes to stdout and the
figures to bench/results/reliability.json. Exit code 1 when any invariant broke.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from llamafleet_testbed.reliability.outcome import ScenarioResult, report, table
from llamafleet_testbed.reliability.run import SCENARIOS, meta, run_all

DEFAULT_OUT = Path("bench/results/reliability.json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamafleet reliability", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"which to run (default: all): {', '.join(SCENARIOS)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON figures (default {DEFAULT_OUT})")
    p.add_argument("--run-dir", type=Path, help="where the fleets keep logs (default: a temporary folder)")
    p.add_argument("--llama-server", type=Path, help="the llama-server binary (default: the project's build)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"llamafleet reliability: unknown scenario(s) {', '.join(unknown)}; "
              f"known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    names = args.scenarios or list(SCENARIOS)

    def progress(result: ScenarioResult) -> None:
        state = "ok" if result.ok else "BROKEN"
        print(f"{result.scenario}: {result.succeeded}/{result.sent} succeeded, {result.failed} failed, "
              f"{result.lost} lost, {result.wrongly_restored} wrongly restored ({state})",
              file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="llamafleet-reliability-") as tmp:
        run_dir = args.run_dir or Path(tmp)
        results = asyncio.run(run_all(names, run_dir, args.llama_server, progress))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report(results, meta()), indent=2) + "\n")
    print(f"\nfigures written to {args.out}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1

"""`llamafleet bench seed-table`: run the seed table's measurements and write the table, JSON and plots.

    llamafleet bench seed-table [--models dense,hybrid] [--repeats N] [--quick] [--out DIR]

Writes `seed_table.md` (the table with ratios and the targets), `seed_table.json` (plan, raw replies
with their output pieces, summary) and `seed_table_ttft.png`, `seed_table_tokens.png` into `--out`
(default `bench/results`). Process logs go to a run folder (`runs/bench-<timestamp>/`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from llamafleet_testbed.bench import report
from llamafleet_testbed.bench.plan import Plan
from llamafleet_testbed.bench.run import run_model
from llamafleet_testbed.bench.setups import SETUPS
from llamafleet_testbed.named_models import NAMED_MODELS

QUICK = {"repeats": 1, "sizes": (6_000, 12_000), "mixed_sessions": 16, "mixed_prefix_chars": 8_000}


def model_names(text: str) -> tuple[str, ...]:
    """`dense,hybrid` as tiny model names; a named model (`smollm2`, `tiny-dense`) stays as it is."""
    names = (m.strip() for m in text.split(","))
    return tuple(m if m in NAMED_MODELS else f"tiny-{m}" for m in names if m)


def plan_from(args: argparse.Namespace) -> Plan:
    models = model_names(args.models)
    plan = Plan(models=models, setups=tuple(args.setups.split(",")))
    if args.quick:
        plan = dataclasses.replace(plan, **QUICK)  # type: ignore[arg-type]
    if args.repeats is not None:
        plan = dataclasses.replace(plan, repeats=args.repeats)
    if args.size_repeats is not None:
        plan = dataclasses.replace(plan, size_repeats=args.size_repeats)
    return plan


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def seed_table(plan: Plan, out: Path, run_dir: Path, *, real_client: bool = True) -> dict[str, Any]:
    raw: dict[str, Any] = {"plan": dataclasses.asdict(plan), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "models": {}}
    started = time.perf_counter()
    for model in plan.models:
        raw["models"][model] = await run_model(model, plan, run_dir, say)
    if real_client:  # the same rows on a real agent client's requests (bench/later_days.py)
        from llamafleet_testbed.bench import later_days, later_days_report

        raw["real_client"] = await later_days.later_days(plan.models, run_dir / "real-client", say)
        raw["real_client"]["ratios"] = later_days_report.ratios(raw["real_client"])
    raw["seconds"] = time.perf_counter() - started
    return raw


def write(raw: dict[str, Any], out: Path, stem: str = "seed_table") -> str:
    """Table, targets, JSON and plots from `raw`; returns the markdown."""
    from llamafleet_testbed.bench import plots

    out.mkdir(parents=True, exist_ok=True)
    summary = report.summarize(raw)
    goals = report.targets(raw, summary)
    text = "\n".join([
        f"Seed table, {raw['started']}, {raw['seconds'] / 60:.1f} minutes. Times are medians of "
        f"{raw['plan']['repeats']} runs (min-max in brackets) where repeated.", "",
        report.markdown(raw, summary), "Targets:", "", report.targets_markdown(goals), "",
        *_real_client_section(raw)])
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(
        {**raw, "summary": report.to_json(summary), "targets": goals}, indent=1, default=str))
    plots.ttft_by_size(summary, out / f"{stem}_ttft.png")
    minimum = {m: int(r.get("minimum_prefill", 0)) for m, r in raw["models"].items()}
    plots.tokens_computed(summary, minimum, out / f"{stem}_tokens.png")
    plots.kv_by_history(summary, out / f"{stem}_kv.png")
    return text


def _real_client_section(raw: dict[str, Any]) -> list[str]:
    if "real_client" not in raw:
        return []
    from llamafleet_testbed.bench import later_days_report

    return ["The real client's layout (Hermes Agent's captured requests: 18 tools and its system prompt, the "
            "date three lines before the head's end), one run each; plain is one llama-server with the "
            "fleet pods' own command line unless the row says otherwise:", "",
            later_days_report.markdown(raw["real_client"])]


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["reliability"]:
        # `llamafleet bench reliability` is `llamafleet reliability`: the fault scenarios' figures.
        from llamafleet_testbed.reliability.cli import main as reliability_main

        return reliability_main(args_in[1:])
    parser = argparse.ArgumentParser(prog="llamafleet bench", description=__doc__.splitlines()[0],
                                     epilog="`llamafleet bench reliability` runs the fault scenarios.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("seed-table", help="TTFT, reuse, tokens computed, KV and agreement against peers")
    p.add_argument("--models", default="dense,hybrid",
                   help="comma-separated: dense, hybrid (tiny) or named models (smollm2)")
    p.add_argument("--repeats", type=int, default=None, help="runs of the 14K three-session scenarios (5)")
    p.add_argument("--size-repeats", type=int, default=None, help="runs of each larger prefix size (1)")
    p.add_argument("--quick", action="store_true", help="small prefixes, one run each: a smoke run")
    p.add_argument("--setups", default=",".join(SETUPS), help="comma-separated subset of " + ",".join(SETUPS))
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--run-dir", type=Path, default=None, help="process logs (default runs/bench-<time>)")
    p.add_argument("--from-json", type=Path, default=None, help="re-render the outputs of an earlier run")
    p.add_argument("--no-real-client", dest="real_client", action="store_false",
                   help="skip the rows on the real client's layout (later_days.py, ~5 minutes; "
                   "--quick skips them)")
    d = sub.add_parser("later-days", help="a real client's first session and later days against plain")
    d.add_argument("--models", default="dense,hybrid",
                   help="comma-separated: dense, hybrid (tiny) or named models (smollm2)")
    d.add_argument("--out", type=Path, default=Path("bench/results"))
    d.add_argument("--run-dir", type=Path, default=None, help="process logs (default runs/later-days-<time>)")
    d.add_argument("--patched", action="store_true",
                   help="the fleets on the project's patched llama-server (plain stays upstream)")
    s = sub.add_parser("simulate", help="a simulated fleet behind the real scheduler, index and Redis")
    s.add_argument("--pods", type=int, default=1000)
    s.add_argument("--slots", type=int, default=4)
    s.add_argument("--minutes", type=float, default=5.0, help="simulated minutes")
    s.add_argument("--sessions-per-hour", type=float, default=100_000.0)
    s.add_argument("--prefixes", type=int, default=200, help="distinct agent prefixes in the Zipf mix")
    s.add_argument("--churn", type=float, default=60.0, help="pods replaced per simulated hour")
    s.add_argument("--baseline", action="store_true",
                   help="run the same traffic again with every pod scored (the scheduler's reference mode)")
    s.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(args_in)
    if args.command == "simulate":
        from llamafleet_testbed.fleet_sim import report as fleet_sim

        return fleet_sim.main(args)
    if args.command == "later-days":
        from llamafleet_testbed.bench import later_days

        models = model_names(args.models)
        run_dir = (args.run_dir or Path("runs") / time.strftime("later-days-%Y%m%d-%H%M%S")).resolve()
        say(f"run folder {run_dir}")
        raw = later_days.main(models, args.out, run_dir, say, patched=args.patched)
        print(json.dumps(raw["ratios"], indent=2))
        return 0
    if args.from_json is not None:
        raw = json.loads(args.from_json.read_text())
        print(write(raw, args.out))
        return 0
    plan = plan_from(args)
    unknown = set(plan.setups) - set(SETUPS)
    if unknown or "plain" not in plan.setups:
        p.error(f"--setups: must include plain (it calibrates sizes); unknown: {sorted(unknown)}")
    run_dir = (args.run_dir or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")).resolve()
    say(f"run folder {run_dir}")
    raw = asyncio.run(seed_table(plan, args.out, run_dir, real_client=args.real_client and not args.quick))
    print(write(raw, args.out))
    return 0

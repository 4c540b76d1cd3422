"""The floor in front of any cache: what one llama-server spends on a perfect slot hit, by prompt size.

A request whose whole prefix is already in the slot it is pinned to (the best any router or cache can
do) still costs the server, before it computes a single token: rendering the chat template (tools and
system prompt included) and tokenizing the whole prompt, on the HTTP thread, for every request. This
run measures that cost for agent prompts of 14K, 24K and 32K tokens on one llama-server started with
the bench fleet's command line (`llamafleet_testbed.bench.plan.Plan`: flash attention off, 4 slots,
36,864 tokens per slot, context checkpoints, 1 thread):

- `ttft`: client-observed time to the first generated piece of a streamed chat request pinned to the
  slot that holds its prefix (a new question each time, the same length);
- `prompt_ms`: the server's own time computing the new tokens (`timings.prompt_ms`);
- `apply_template` and `tokenize`: the server's `/apply-template` and `/tokenize` for the same request,
  timed apart, which is the work the chat route does before the slot sees the request.

Why it matters: the seed table's "TTFT at 32K at most 1.2x TTFT at 14K" goal for llamafleet assumes the
server's own per-request cost is small next to what a cache saves. Here it is not: the growth of this
floor from 14K to 32K is what a gateway in front of an unmodified llama-server cannot take away.

    .venv/bin/python bench/bench_server_floor.py [--models tiny-dense,tiny-hybrid] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.redis_server import free_port
from llamafleet_testbed.bench.plan import Plan, prefix_tokens_on
from llamafleet_testbed.llama_build import build
from llamafleet_testbed.tinymodels import ensure_model
from llamafleet_testbed.workload import (
    PREFIX_TOKENS,
    WorkloadSpec,
    chars_for_tokens,
    make_profile,
    user_question,
)

HERE = Path(__file__).resolve().parent


def server_argv(binary: Path, model: Path, port: int, plan: Plan) -> list[str]:
    """The bench fleet's llama-server flags that matter for this cost (no agent: nothing is saved)."""
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(plan.slots), "-c", str(plan.slots * plan.context_per_slot),
            "-fa", plan.flash_attention, "-t", str(plan.threads), "--ctx-checkpoints", "128",
            "-ctk", "f16", "-ctv", "f16"]


def timed_stream(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(seconds to the first generated piece, the server's prompt_ms) of one streamed chat request."""
    started, first, prompt_ms = time.perf_counter(), 0.0, 0.0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            delta = ((event.get("choices") or [{}])[0].get("delta")) or {}
            if not first and (delta.get("content") or delta.get("reasoning_content")):
                first = time.perf_counter() - started
            if "timings" in event:
                prompt_ms = float(event["timings"]["prompt_ms"])
    return first, prompt_ms


def measure_size(http: httpx.Client, url: str, model: str, chars: int, repeats: int) -> dict[str, Any]:
    profile = make_profile(WorkloadSpec(prefix_chars=chars, workspace=f"/home/dev/floor-{chars}"))
    rng = random.Random(chars)
    warm = {**profile.request(model, user_question(rng), max_tokens=4), "id_slot": 0}
    timed_stream(http, url, warm)  # the slot now holds the prefix
    rows = []
    for _ in range(repeats):
        body = {**profile.request(model, user_question(rng), max_tokens=4), "id_slot": 0}
        t = time.perf_counter()
        prompt = http.post(url + "/apply-template", json={k: body[k] for k in ("messages", "tools")})
        apply_s = time.perf_counter() - t
        t = time.perf_counter()
        tokens = http.post(url + "/tokenize", json={"content": prompt.json()["prompt"], "add_special": True})
        tokenize_s = time.perf_counter() - t
        ttft, prompt_ms = timed_stream(http, url, body)
        rows.append({"ttft_ms": ttft * 1000, "prompt_ms": prompt_ms, "apply_template_ms": apply_s * 1000,
                     "tokenize_ms": tokenize_s * 1000, "tokens": len(tokens.json()["tokens"])})
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["rows"] = rows
    return out


def run_model(model: str, repeats: int, plan: Plan) -> dict[str, Any]:
    port = free_port()
    with tempfile.NamedTemporaryFile(prefix="floor-", suffix=".log") as log:
        proc = subprocess.Popen(server_argv(build(), ensure_model(model), port, plan),
                                stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(timeout=600) as http:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        if http.get(url + "/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"llama-server did not start; log {log.name}")
                    time.sleep(0.2)
                sizes = {}
                for size in PREFIX_TOKENS:
                    chars = chars_for_tokens(size, prefix_tokens_on(url))
                    sizes[str(size)] = measure_size(http, url, model, chars, repeats)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    small, large = sizes[str(PREFIX_TOKENS[0])], sizes[str(PREFIX_TOKENS[-1])]
    return {"sizes": sizes, "ttft_growth": large["ttft_ms"] / small["ttft_ms"],
            "per_request_growth": (large["apply_template_ms"] + large["tokenize_ms"])
            / (small["apply_template_ms"] + small["tokenize_ms"])}


def table(results: dict[str, Any]) -> str:
    lines = ["| model | prefix tokens | TTFT on a perfect slot hit | server prompt_ms | /apply-template "
             "| /tokenize |", "|---|---:|---:|---:|---:|---:|"]
    for model, res in results.items():
        for size, r in res["sizes"].items():
            lines.append(f"| {model} | {r['tokens']} (target {size}) | {r['ttft_ms']:.0f} ms | "
                         f"{r['prompt_ms']:.0f} ms | {r['apply_template_ms']:.0f} ms | "
                         f"{r['tokenize_ms']:.0f} ms |")
        growth = f"growth {PREFIX_TOKENS[-1] // 1000}K / {PREFIX_TOKENS[0] // 1000}K"
        lines.append(f"| {model} | {growth} | {res['ttft_growth']:.2f}x | | "
                     f"template + tokenize {res['per_request_growth']:.2f}x | |")
    return "\n".join(lines) + "\n\n(medians; one llama-server, the bench fleet's flags)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny-dense,tiny-hybrid")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=HERE / "results" / "server_floor.json")
    args = p.parse_args()
    started, plan = time.time(), Plan()
    results = {model: run_model(model, args.repeats, plan) for model in args.models.split(",")}
    print(table(results))
    meta = {"repeats": args.repeats, "cpus": os.cpu_count(), "python": platform.python_version(),
            "seconds": round(time.time() - started, 1), "flash_attention": plan.flash_attention,
            "threads": plan.threads, "slots": plan.slots, "context_per_slot": plan.context_per_slot}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

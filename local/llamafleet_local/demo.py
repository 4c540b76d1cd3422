"""`llamafleet demo` / `make demo`: the smallest end-to-end run on one machine.

It builds (or reuses) llama-server and a tiny model, starts one server, sends an agent-like chat
request (tool schemas plus a system prompt, then a question), then a second session with the same
prefix and another question pinned to the same slot, and shows how many prompt tokens the server
reused (`timings.cache_n`). Later the demo runs a whole local fleet behind the gateway.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.cache import log
from llamafleet_local.llama_build import build
from llamafleet_local.llama_process import LlamaServerProcess
from llamafleet_local.tinymodels import MODEL_NAMES, ensure_model
from llamafleet_local.workload import WorkloadSpec, make_profile, user_question


def _chat(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    resp = http.post(url + "/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    resp.raise_for_status()
    result: dict[str, Any] = resp.json()
    return result, elapsed


def run(model_name: str, prefix_chars: int, workdir: Path) -> int:
    binary = build()
    model = ensure_model(model_name)
    profile = make_profile(WorkloadSpec(prefix_chars=prefix_chars))
    rng = random.Random(1)
    server = LlamaServerProcess(binary=binary, model=model, workdir=workdir, slots=2)
    log(f"starting llama-server with {model.name} (2 slots, 1 thread)")
    server.start()
    rows: list[tuple[str, int, int, float]] = []
    try:
        with httpx.Client(timeout=300.0) as http:
            for label in ("session 1 (cold)", "session 2 (same prefix, same slot)"):
                body = profile.request(model_name, user_question(rng), max_tokens=8, stream=False)
                body["id_slot"] = 0
                result, elapsed = _chat(http, server.url, body)
                timings = result.get("timings", {})
                rows.append((label, int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0)), elapsed))
                answer = result["choices"][0]["message"].get("content") or ""
                log(f"{label}: answered {answer[:60]!r}")
    finally:
        server.stop()
    print(f"\nllama-server {binary.name}, model {model_name}, prefix {profile.prefix_chars} characters\n")
    print(f"| {'request':<36} | {'computed':>9} | {'reused':>7} | {'seconds':>8} |")
    print(f"|{'-' * 38}|{'-' * 11}|{'-' * 9}|{'-' * 10}|")
    for label, computed, reused, seconds in rows:
        print(f"| {label:<36} | {computed:>9} | {reused:>7} | {seconds:>8.2f} |")
    if rows[1][2] <= 0:
        log("error: the second session reused nothing; the server's prompt cache is not working")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamafleet demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-hybrid", choices=MODEL_NAMES)
    parser.add_argument("--prefix-chars", type=int, default=20_000, help="size of tools + system prompt")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llamafleet-demo-") as tmp:
        return run(args.model, args.prefix_chars, Path(tmp))

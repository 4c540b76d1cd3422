"""What llama-server's default `--cache-idle-slots` costs each task on a real model, against
`--no-cache-idle-slots` in the same run.

With it (upstream's default whenever `--cache-ram` is on), every task launch copies each idle slot
whose content changed into the RAM prompt cache, inside the server's main loop, before the task runs;
with a unified KV pool it also clears them. An agent fleet's idle slots hold long sessions, and the
gateway pins every turn to the slot holding its session, so the copies buy nothing it uses while each
turn waits for them. On the tiny models a copy costs nothing measurable; this run uses SmolLM2-135M
(about 23 KB of KV per token: ~170 MB per slot at 7K tokens).

The run: one server per mode, `slots` per-slot streams (the gateway's layout for upstream pods), every
slot but one filled with its own session of `tokens` tokens; then `rounds` turns, each extending one
session (round-robin) by a few dozen tokens on its own slot, so that at every launch the other sessions'
slots changed since their last copy. Per turn: the client's wall time, and the server's own time for
the turn (`prompt_ms + predicted_ms`); their difference is the launch overhead the copies add to.

    .venv/bin/python bench/bench_idle_slots.py [--tokens 7000] [--slots 3] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.redis_server import free_port
from llamafleet_testbed.llama_build import build
from llamafleet_testbed.real_models import ensure_real_model

HERE = Path(__file__).resolve().parent
SLOT_CTX = 8192  # SmolLM2's training context: llama-server caps a slot there
CACHE_RAM_MIB = 8192  # upstream's default
TIMEOUT = 600.0


def server_argv(binary: Path, model: Path, port: int, slots: int, threads: int,
                idle_slots: bool) -> list[str]:
    return [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(slots * SLOT_CTX), "-no-kvu", "-fa", "on", "-t", str(threads), "-tb", str(threads),
            "--cache-ram", str(CACHE_RAM_MIB),
            "--cache-idle-slots" if idle_slots else "--no-cache-idle-slots"]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 180.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling a process that gives no other signal of readiness
    raise RuntimeError("llama-server did not turn healthy")


def _tokens(http: httpx.Client, url: str, text: str) -> list[int]:
    answer = http.post(url + "/tokenize", json={"content": text, "add_special": False}).json()
    return [int(t) for t in answer["tokens"]]


def _turn(http: httpx.Client, url: str, prompt: list[int], slot: int) -> dict[str, float]:
    started = time.perf_counter()
    resp = http.post(url + "/completion", json={"prompt": prompt, "n_predict": 1, "id_slot": slot,
                                                "cache_prompt": True, "temperature": 0})
    wall_ms = (time.perf_counter() - started) * 1000
    resp.raise_for_status()
    timings = resp.json()["timings"]
    served = float(timings["prompt_ms"]) + float(timings["predicted_ms"])
    return {"wall_ms": wall_ms, "server_ms": served, "overhead_ms": wall_ms - served,
            "cache_n": float(timings["cache_n"]), "prompt_n": float(timings["prompt_n"])}


def run_mode(binary: Path, model: Path, args: argparse.Namespace, idle_slots: bool) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="idle-slots-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(server_argv(binary, model, port, args.slots, args.threads, idle_slots),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, proc)
        with httpx.Client(timeout=TIMEOUT) as http:
            sessions = []
            for s in range(args.slots - 1):
                words = " ".join(f"session {s} line {i}: item_{i * 7 + s} is due on day {i % 28}."
                                 for i in range(args.tokens // 12 + 1))
                sessions.append(_tokens(http, url, words)[: args.tokens])
                _turn(http, url, sessions[s], s)  # fill its slot
            turns = []
            for r in range(args.rounds):
                s = r % len(sessions)
                sessions[s] = sessions[s] + _tokens(http, url, f" Turn {r}: what is due on day {r}?")
                turns.append(_turn(http, url, sessions[s], s))
        return {"idle_slots": idle_slots, "turns": turns,
                "median": {k: statistics.median(t[k] for t in turns) for k in turns[0]}}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=7_000)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "idle_slots.json")
    args = parser.parse_args()
    if args.slots < 2 or not 0 < args.tokens < SLOT_CTX - 64 * args.rounds:
        parser.error("need --slots >= 2 and sessions that stay inside a slot's 8,192 tokens")
    binary, model = build(), ensure_real_model("smollm2")
    on, off = run_mode(binary, model, args, True), run_mode(binary, model, args, False)
    result = {
        "settings": vars(args) | {"out": str(args.out.name), "model": "smollm2",
                                  "machine": platform.machine(), "cpus": os.cpu_count()},
        "on": on, "off": off,
        "overhead_ratio": on["median"]["overhead_ms"] / max(off["median"]["overhead_ms"], 1e-3),
        "wall_ratio": on["median"]["wall_ms"] / off["median"]["wall_ms"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, mode in (("--cache-idle-slots (default)", on), ("--no-cache-idle-slots", off)):
        m = mode["median"]
        print(f"{name}: turn {m['wall_ms']:.0f} ms, server {m['server_ms']:.0f} ms, "
              f"launch overhead {m['overhead_ms']:.0f} ms (median of {args.rounds})")
    print(f"overhead on/off {result['overhead_ratio']:.1f}x, turn on/off {result['wall_ratio']:.2f}x")


if __name__ == "__main__":
    main()

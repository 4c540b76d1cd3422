"""Added latency of a router: client-observed latency through it minus latency straight to the upstream.

One run starts, each in its own process: a stub llama-server (`stub_backend.py`), a real redis-server,
the llamafleet gateway twice (`llamafleet router --index memory`, and `--redis URL`), sglang-router with
its cache-aware policy (when installed), and a load client (this file with `--client`, aiohttp). With
`--gateway-workers 1 2 4` the Redis gateway is one setup per worker count (`--workers N`,
`llamafleet-redis-wN`; N = 1 is the single process), all in the same rounds. The
client keeps `--concurrency` streams open (a closed loop) and measures, per request, the time to the
first event that carries generated text (TTFT; see ANSWERING below) and to the end of the stream
(total). Each batch goes to one setup; setups and prompts are interleaved in rounds, in a rotated order,
so machine noise hits all of them alike, and every figure is the median over rounds. "Added" is router
minus direct within the same round.

Two prompts: `small` (a system line and a question, ~300 characters) and `agent` (18-ish tool schemas
and a long system prompt, ~60K characters, from `llamafleet_testbed.workload`; the gateway renders it with
the model's chat template and hashes it). Two loads:

- `paced`: the stub spreads each stream over `--stream-ms` (a generation in progress), so 64 streams are
  open at once while requests arrive at about concurrency / stream time. The issue's goal applies here:
  llamafleet's added p50 <= 1 ms and p99 <= 5 ms at 64 concurrent streams.
- `saturated`: the stub answers at once, so the loop measures capacity; latency is then mostly queueing
  behind the router's CPU, and requests per second and router CPU per request are the useful figures.

    .venv/bin/python bench/bench_router_overhead.py [--rounds 5] [--requests 192] [--stream-ms 500]
    .venv/bin/python bench/bench_router_overhead.py --modes saturated --prompts agent \
        --gateway-workers 1 2 4 --out bench/results/router_workers.json

A setup's CPU is its whole process tree's (a supervisor and its workers), read from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
MODEL = "bench-model.gguf"  # the stub's model name (from its model_path), as the gateway resolves it
PROMPTS = ("small", "agent")
# The first event that answers: generated text (or the end). llama-server, and the stub, send a role-only
# chunk first, before the prompt is computed; the gateway holds that back until the pod really answers
# (so that a pod dying in its prefill can still be retried elsewhere). Timing the first *byte* would
# charge the router for a chunk that tells the client nothing, so every setup is timed to this.
ANSWERING = (b'"content":"', b"[DONE]")


# ---- the load client (its own process) -------------------------------------------------------------


def bodies(kind: str, n: int = 128) -> list[bytes]:
    """`n` distinct request bodies of one kind: same prefix, different questions (seeded)."""
    from llamafleet_testbed.workload import WorkloadSpec, make_profile, user_question

    rng = random.Random(11)
    if kind == "agent":
        profile = make_profile(WorkloadSpec(prefix_chars=60_000))
        return [json.dumps(profile.request(MODEL, user_question(rng))).encode() for _ in range(n)]
    out = []
    for _ in range(n):
        body = {"model": MODEL, "stream": True, "max_tokens": 16, "temperature": 0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": "You are a helpful assistant. Answer briefly, "
                              "in plain English, and say so when you are not sure."},
                             {"role": "user", "content": user_question(rng) + " " + user_question(rng)}]}
        out.append(json.dumps(body).encode())
    return out


async def load(
    url: str, payloads: list[bytes], n: int, concurrency: int, warmup: int = 0, spread_s: float = 0.0
) -> dict[str, Any]:
    """Closed loop: `concurrency` workers send until `warmup + n` requests are done; the first `warmup`
    are not recorded (they open the connections). Worker k starts `k * spread_s / concurrency` late and
    pauses up to `spread_s / concurrency` between requests: with streams of equal length, workers started
    together would stay in lockstep and every wave would queue behind 63 others, which is the load
    generator's artefact, not the router's cost."""
    import asyncio

    import aiohttp

    ttft: list[float] = []
    total: list[float] = []
    errors: list[str] = []
    next_i = 0
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def one(body: bytes, record: bool) -> None:
            start = time.perf_counter()
            tail = b""
            t_first = 0.0
            async with s.post(url, data=body, headers=headers) as resp:
                head = b""
                while chunk := await resp.content.readany():
                    if not t_first:
                        head += chunk
                        if any(mark in head for mark in ANSWERING):
                            t_first = time.perf_counter()
                    tail = (tail + chunk)[-64:] if t_first else head[-64:]
                t_end = time.perf_counter()
            if resp.status != 200 or b"[DONE]" not in tail or not t_first:
                errors.append(f"status {resp.status}, ends {tail[-40:]!r}")
                return
            if not record:
                return
            ttft.append(t_first - start)
            total.append(t_end - start)

        step = spread_s / concurrency
        rng = random.Random(5)
        measure_start = [0.0]

        async def worker(k: int) -> None:
            nonlocal next_i
            await asyncio.sleep(k * step)
            while next_i < warmup + n:
                i = next_i
                next_i += 1
                if i == warmup:
                    measure_start[0] = time.perf_counter()
                try:
                    await one(payloads[i % len(payloads)], i >= warmup)
                except Exception as exc:  # counted, not fatal: the batch reports its errors
                    errors.append(f"{type(exc).__name__}: {exc}")
                if step:
                    await asyncio.sleep(rng.uniform(0, step))

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        wall = time.perf_counter() - measure_start[0]
    return {"ttft": ttft, "total": total, "errors": errors[:5], "n_errors": len(errors), "wall": wall}


def client_main() -> None:
    """Read one JSON command per line on stdin, answer one JSON line per command on stdout."""
    import asyncio

    payloads = {kind: bodies(kind) for kind in PROMPTS}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        data = payloads[cmd["prompt"]]
        result = asyncio.run(load(cmd["url"], data, cmd["n"], cmd["concurrency"], cmd.get("warmup", 0),
                                  cmd.get("spread_s", 0.0)))
        print(json.dumps(result), flush=True)


# ---- the orchestrator --------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and of its descendants, those alive and those it
    has waited for (cutime + cstime), from /proc (Linux): a supervisor's setup is charged its workers."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # gone between listing and reading
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK") + sum(cpu_seconds(child) for child in children(pid))


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


class Fleet:
    """The processes of one run; `stop()` ends exactly the ones it started."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                start_new_session=True, env=env)
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def free_port() -> int:
    from llamafleet_local.redis_server import free_port as fp

    return fp()


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(
    url: str, name: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0,
    health_url: str | None = None,
) -> None:
    """Until one streamed chat request through `url` answers 200 (the gateway needs its first poll),
    and `health_url` (a supervisor's: 200 once every worker is healthy) does too."""
    body = bodies("small", 1)[0]
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start (code {proc.returncode}):\n{log_tail(log)}")
        try:
            r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=5)
            ok = r.status_code == 200 and b"[DONE]" in r.content
            if ok and health_url is not None:
                r = httpx.get(health_url, timeout=5)
                ok = r.status_code == 200
            if ok:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise TimeoutError(f"{name} not ready after {timeout}s: {last}\n{log_tail(log)}")


def checkout_env(root: Path) -> dict[str, str]:
    """The environment that runs the gateway of another checkout: its package folders on PYTHONPATH,
    ahead of this checkout's (editable) install, so old and new code run in one process tree."""
    folders = [root / name for name in ("core", "router", "agent", "operator", "cli", "local", "testbed")]
    found = [str(f) for f in folders if f.is_dir()]
    if not (root / "router").is_dir():
        raise SystemExit(f"--baseline {root}: not a llamafleet checkout (no router/)")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(found)}


def revision(root: Path) -> str:
    """The commit a checkout is at (what the results name; never its path)."""
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or "unknown"


def start_setups(fleet: Fleet, redis_url: str, args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    """Start the stub and the routers; returns setup name -> (chat URL, pid to charge CPU to)."""
    ready = fleet.workdir / "stub.port"
    stub = fleet.spawn("stub", [sys.executable, str(HERE / "stub_backend.py"), "--slots", str(args.slots),
                                "--ready-file", str(ready)])
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text():
        if stub.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the stub did not start; see stub.log")
        time.sleep(0.05)
    upstream = f"http://127.0.0.1:{ready.read_text()}"
    setups = {"direct": (f"{upstream}/v1/chat/completions", stub.pid)}
    lf = [sys.executable, "-m", "llamafleet_cli.cli", "router", "--pods", upstream]
    if args.router_log_level:
        lf += ["--log-level", args.router_log_level.upper()]
    routers = {"llamafleet-memory": [*lf, "--index", "memory"]}
    envs: dict[str, dict[str, str]] = {}
    health: dict[str, str] = {}
    for n in args.gateway_workers:
        name = "llamafleet-redis" if args.gateway_workers == [1] else f"llamafleet-redis-w{n}"
        routers[name] = [*lf, "--redis", redis_url]
        if n > 1:
            routers[name] += ["--workers", str(n)]
            metrics_port = free_port()  # the supervisor's: its /health says when every worker is up
            envs[name] = {**os.environ, "LLAMAFLEET_ROUTER_METRICS_PORT": str(metrics_port)}
            health[name] = f"http://127.0.0.1:{metrics_port}/health"
    if args.baseline is not None:
        env = checkout_env(args.baseline)
        for index in ("memory", "redis"):
            routers[f"baseline-{index}"] = [*lf, "--index", "memory"] if index == "memory" else [
                *lf, "--redis", redis_url]
            envs[f"baseline-{index}"] = env
    if args.sglang:
        sgl = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--worker-urls", upstream, "--policy", "cache_aware"]
        if args.router_log_level:
            level = args.router_log_level.lower()
            sgl += ["--log-level", {"warning": "warn", "critical": "error"}.get(level, level)]
        routers["sglang-router"] = sgl
    if args.floors:
        # What Python itself costs: the same stack doing no work, and bytes copied with no framework.
        for mode in ("asgi", "raw"):
            routers[f"python-floor-{mode}"] = [sys.executable, str(HERE / "floor_proxy.py"), "--mode", mode,
                                               "--upstream", upstream]
    for name, argv in routers.items():
        port = free_port()
        proc = fleet.spawn(name, [*argv, "--port", str(port)], envs.get(name))
        setups[name] = (f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid)
    for name, (url, _) in setups.items():
        proc_name = "stub" if name == "direct" else name
        wait_ready(url, name, fleet.procs[proc_name], fleet.workdir / f"{proc_name}.log",
                   health_url=health.get(name))
    return setups


def sglang_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang_router") is not None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from llamafleet_local.redis_server import RedisServer

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        workdir = Path(tmp)
        redis = RedisServer(workdir / "redis").start()
        fleet = Fleet(workdir)
        client: subprocess.Popen[str] | None = None
        try:
            setups = start_setups(fleet, redis.url, args)
            stub_url = setups["direct"][0].rsplit("/v1/", 1)[0]
            client = subprocess.Popen([sys.executable, __file__, "--client"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
            assert client.stdin is not None and client.stdout is not None
            json.loads(client.stdout.readline())  # ready
            loads = {"paced": args.stream_ms, "saturated": 0.0}
            for mode in args.modes:
                httpx.post(f"{stub_url}/stub/config", json={"stream_ms": loads[mode]}, timeout=5)
                n = args.requests if mode == "paced" else args.saturated_requests
                for rnd in range(args.rounds):
                    for prompt in args.prompts:
                        names = list(setups)
                        order = names[rnd % len(names):] + names[: rnd % len(names)]
                        for name in order:
                            url, pid = setups[name]
                            cpu0 = cpu_seconds(pid)
                            cmd = {"url": url, "prompt": prompt, "n": n, "concurrency": args.concurrency,
                                   "warmup": args.concurrency, "spread_s": loads[mode] / 1000}
                            client.stdin.write(json.dumps(cmd) + "\n")
                            client.stdin.flush()
                            res = json.loads(client.stdout.readline())
                            cpu = cpu_seconds(pid) - cpu0
                            row = {"p50_ttft": pct(res["ttft"], 0.5), "p99_ttft": pct(res["ttft"], 0.99),
                                   "p50_total": pct(res["total"], 0.5), "p99_total": pct(res["total"], 0.99),
                                   "rps": len(res["ttft"]) / res["wall"], "errors": res["n_errors"],
                                   # warm-up requests ran in the same CPU window
                                   "cpu_ms_per_req": cpu * 1000 / (n + args.concurrency)}
                            if res["n_errors"]:
                                print(f"  {mode}/{prompt}/{name}: {res['n_errors']} errors: {res['errors']}",
                                      file=sys.stderr)
                            by_setup = results.setdefault(mode, {}).setdefault(prompt, {})
                            by_setup.setdefault(name, []).append(row)
                        print(f"  {mode} round {rnd + 1}/{args.rounds} {prompt} done", file=sys.stderr)
        finally:
            if client is not None:
                if client.stdin is not None:
                    client.stdin.close()
                try:
                    client.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    client.kill()
            fleet.stop()
            redis.stop()
    return results


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds of each figure, and added latency over direct (paired within rounds)."""
    out: dict[str, Any] = {}
    for mode, by_prompt in raw.items():
        for prompt, by_setup in by_prompt.items():
            direct = by_setup["direct"]
            for name, rounds in by_setup.items():
                fig = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                fig["errors"] = sum(r["errors"] for r in rounds)
                if name != "direct":
                    for k in ("p50_ttft", "p99_ttft", "p50_total", "p99_total"):
                        fig[f"added_{k}"] = statistics.median(r[k] - d[k] for r, d in zip(rounds, direct,
                                                                                             strict=True))
                    fig["rps_ratio"] = fig["rps"] / statistics.median(d["rps"] for d in direct)
                out.setdefault(mode, {}).setdefault(prompt, {})[name] = fig
    return out


def table(summary: dict[str, Any]) -> str:
    lines = []
    for mode, by_prompt in summary.items():
        lines += [f"\n### {mode}\n",
                  "| prompt | setup | TTFT p50 | TTFT p99 | added TTFT p50 | added TTFT p99 "
                  "| added total p50 | added total p99 | req/s | router CPU ms/req | errors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for prompt, by_setup in by_prompt.items():
            for name, f in by_setup.items():
                added = [f.get(f"added_{k}") for k in ("p50_ttft", "p99_ttft", "p50_total", "p99_total")]
                cells = ["-" if a is None else f"{a:+.2f}" for a in added]
                lines.append(f"| {prompt} | {name} | {f['p50_ttft']:.2f} | {f['p99_ttft']:.2f} | "
                             + " | ".join(cells)
                             + f" | {f['rps']:.0f} | {f['cpu_ms_per_req']:.2f} | {f['errors']} |")
    return "\n".join(lines) + "\n\n(milliseconds; medians over rounds; CPU of the direct row is the stub's)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=192, help="measured requests per batch (paced)")
    p.add_argument("--saturated-requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--stream-ms", type=float, default=500.0, help="stream duration of the paced load")
    p.add_argument("--slots", type=int, default=64, help="the stub pod's total_slots")
    p.add_argument("--modes", nargs="+", choices=["paced", "saturated"], default=["paced", "saturated"])
    p.add_argument("--prompts", nargs="+", choices=PROMPTS, default=list(PROMPTS))
    p.add_argument("--gateway-workers", nargs="+", type=int, default=[1], metavar="N",
                   help="run the Redis gateway once per worker count (--workers N), e.g. 1 2 4")
    p.add_argument("--router-log-level", help="pass --log-level to both routers (default: theirs)")
    p.add_argument("--no-sglang", dest="sglang", action="store_false")
    p.add_argument("--no-floors", dest="floors", action="store_false",
                   help="skip the Python floor proxies (floor_proxy.py)")
    p.add_argument("--baseline", type=Path, help="a checkout of another revision (git worktree): its gateway "
                   "runs beside this one's as baseline-memory and baseline-redis, interleaved in each round")
    p.add_argument("--out", type=Path, default=HERE / "results" / "router_overhead.json")
    args = p.parse_args()
    if args.client:
        client_main()
        return
    if args.sglang and not sglang_available():
        print("sglang-router is not installed (pip install 'llamafleet[bench]'); skipping it",
              file=sys.stderr)
        args.sglang = False
    started = time.time()
    raw = run(args)
    summary = summarize(raw)
    print(table(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"rounds": args.rounds, "requests": args.requests, "saturated_requests": args.saturated_requests,
            "concurrency": args.concurrency, "stream_ms": args.stream_ms, "slots": args.slots,
            "router_log_level": args.router_log_level, "cpus": os.cpu_count(),
            "modes": args.modes, "prompts": args.prompts, "gateway_workers": args.gateway_workers,
            "baseline": None if args.baseline is None else revision(args.baseline),
            "python": platform.python_version(), "seconds": round(time.time() - started, 1),
            "goal": {"added_p50_ttft_ms": 1.0, "added_p99_ttft_ms": 5.0, "load": "paced"}}
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "rounds": raw}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Run the seed-table benchmark: every model through setups (a), (b) and (c).

The three setups of a model are started together, and the headline scenario (the 3rd concurrent
session, prompts as they are) runs interleaved: repeat r runs on every setup, in an order rotated by r,
before repeat r + 1 starts. Run one after the other, each setup's repeats fell in its own minutes of
the run, and this shared machine's speed drifts by a third over such spans: a (b)/(c) ratio then
measured the drift as much as the setups. The other scenarios run setup by setup afterwards.

Only one setup works at a time (the others' servers sit idle), and every setup gets the same request
bodies in the same order. Raw replies are kept in the result (with their output pieces), so the summary
can be recomputed from the JSON alone (`report.summarize`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from llamafleet_core import http_pool
from llamafleet_local.up.config import FleetConfig, parse_documents
from llamafleet_local.up.resolve import Resolved, resolve
from llamafleet_testbed.bench import scenarios as sc
from llamafleet_testbed.bench.client import Reply, stream_chat
from llamafleet_testbed.bench.plan import Plan, Profiles, fleet_docs, make_profiles, prefix_tokens_on
from llamafleet_testbed.bench.setups import BASELINE_FLASH_ATTENTION, FLEETS, Fleet, PlainPods
from llamafleet_testbed.bench.stats import restore_records
from llamafleet_testbed.workload import chars_for_tokens, mixed_workload


def replies(rs: list[Reply]) -> list[dict[str, Any]]:
    return [r.summary() for r in rs]


TIMEOUT = httpx.Timeout(30.0, read=900.0)


async def run_as_is(setups: dict[str, PlainPods | Fleet], model: str, profiles: Profiles,
                    say: Callable[[str], None]) -> dict[str, list[list[dict[str, Any]]]]:
    """The 3rd-concurrent-session runs, prompts as they are, interleaved over the started setups: repeat
    r on every setup (order rotated by r) before repeat r + 1."""
    kinds = list(setups)
    out: dict[str, list[list[dict[str, Any]]]] = {kind: [] for kind in kinds}
    async with http_pool.async_client(timeout=TIMEOUT) as http:
        for r, prof in enumerate(profiles.as_is):
            for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                out[kind].append(replies(await sc.three_sessions(http, setups[kind].url, prof, model,
                                                                 f"as-is/{r}")))
                say(f"{kind}: 3 sessions, as they are, run {r + 1}: 3rd TTFT {_ttft(out[kind])}")
    return out


async def run_setup(setup: PlainPods | Fleet, kind: str, model: str, profiles: Profiles, plan: Plan,
                    say: Callable[[str], None], as_is: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The other scenarios against one started setup, after its interleaved `as_is` runs; raw replies
    by scenario."""
    out: dict[str, Any] = {"as_is": as_is, "declared": [], "warm_up": [], "sizes": {}}
    async with http_pool.async_client(timeout=TIMEOUT) as http:
        url = setup.url
        if kind in FLEETS:
            out["snapshot_files"] = _snapshot_files(setup)
        for r, prof in enumerate(profiles.declared):
            if kind not in FLEETS:  # (c), (d) declared it: warmed at start; (a), (b) get a warm-up request
                out["warm_up"].append((await sc.warm_up(http, url, prof, model)).summary())
            out["declared"].append(replies(await sc.three_sessions(http, url, prof, model, f"declared/{r}")))
            say(f"{kind}: 3 sessions, declared, run {r + 1}: 3rd TTFT {_ttft(out['declared'])}")
        for size, profs in profiles.sizes.items():
            out["sizes"][str(size)] = [
                replies(await sc.three_sessions(http, url, prof, model, f"size-{size}/{r}"))
                for r, prof in enumerate(profs)]
            say(f"{kind}: 3 sessions at {size} tokens: 3rd TTFT {_ttft(out['sizes'][str(size)])}")
        assert profiles.day1 is not None and profiles.day2 is not None
        started = time.perf_counter()
        day = await sc.later_day(http, url, profiles.day1, profiles.day2, model, "day", setup.restart_all)
        out["later_day"] = replies(day)
        out["restart_s"] = time.perf_counter() - started
        say(f"{kind}: later day: first {day[1].ttft_s:.3f} s, next {day[2].ttft_s:.3f} s")
        plans = mixed_workload(plan.mixed_sessions, prefix_chars=plan.mixed_prefix_chars)
        before = await sc.prompt_tokens_processed(http, setup.servers)
        started = time.perf_counter()
        mixed = await sc.mixed(http, url, plans, model)
        after = await sc.prompt_tokens_processed(http, setup.servers)
        failed = sum(r.status != 200 or bool(r.error) for r in mixed)
        out["mixed"] = {"computed": after - before, "seconds": time.perf_counter() - started,
                        "requests": len(mixed), "failed": failed,
                        "cache_n": sum(r.cache_n for r in mixed), "prompt_n": sum(r.prompt_n for r in mixed),
                        "pods": _pods_hit(mixed),
                        "errors": sorted({f"{r.status}: {r.error[:200]}" for r in mixed if r.error})[:5]}
        say(f"{kind}: mixed workload: {after - before} prompt tokens computed")
        assert profiles.ram_day1 and profiles.ram_day2 and profiles.other and profiles.kv
        day = await sc.later_day_from_ram(http, url, profiles.ram_day1, profiles.ram_day2, profiles.other,
                                          model, "ram-day", len(setup.servers) * plan.slots)
        out["later_day_ram"] = replies(day)
        say(f"{kind}: later day from RAM: first {day[1].ttft_s:.3f} s, next {day[2].ttft_s:.3f} s")
        out["kv_by_history"] = []
        for turns in sc.HISTORY_TURNS:
            three, cells = await sc.three_at_once(http, url, setup.servers, profiles.kv, model, "kv",
                                                  setup.restart_all, turns)
            out["kv_by_history"].append({"history_turns": turns, "replies": replies(three), **cells})
            say(f"{kind}: 3 sessions at once, {turns} turns of history: {cells['cells']} KV cells "
                f"({cells['source']})")
        out["snapshot_bytes"] = setup.snapshot_bytes()
        if isinstance(setup, Fleet) and setup.gateway_log.is_file():  # restore times, from its own log
            with setup.gateway_log.open(encoding="utf-8", errors="replace") as log:
                out["restores"] = restore_records(log)
    return out


def _ttft(runs: list[list[dict[str, Any]]]) -> str:
    return f"{runs[-1][2]['ttft_s']:.3f} s"


def _pods_hit(rs: list[Reply]) -> dict[str, int]:
    hits: dict[str, int] = {}
    for r in rs:
        pod = r.headers.get("x-llamafleet-pod", "?")
        hits[pod] = hits.get(pod, 0) + 1
    return hits


def _snapshot_files(setup: PlainPods | Fleet) -> list[dict[str, Any]]:
    if not isinstance(setup, Fleet):
        return []
    return [{"pod": p.name, "name": f.name, "bytes": f.stat().st_size}
            for p in setup.fleet.pods for f in sorted(p.layout.snapshot_dir.glob("*.bin"))]


async def minimum_for(server: str, plan: Plan, model: str) -> int:
    """Prefill tokens a perfect cache would compute for the mixed workload (the token trie's size)."""
    from llamafleet_testbed.bench.stats import minimum_prefill

    prompts: list[list[int]] = []
    async with http_pool.async_client(timeout=120.0) as http:
        for p in mixed_workload(plan.mixed_sessions, prefix_chars=plan.mixed_prefix_chars):
            for body in p.requests(model):
                prompts.append(await sc.prompt_tokens(http, server, body))
    return minimum_prefill(prompts)


async def run_model(model: str, plan: Plan, run_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    base = parse_documents(fleet_docs(model, plan, []), "bench", run_dir)
    resolved = await asyncio.to_thread(resolve, base, say)
    result: dict[str, Any] = {"setups": {}, "kv": _kv(model)}
    profiles: Profiles | None = None
    setups: dict[str, PlainPods | Fleet] = {}
    seconds: dict[str, float] = {}
    try:
        for kind in plan.setups:  # all started first: the headline runs interleave (module docstring)
            folder = run_dir / model / kind
            setup: PlainPods | Fleet
            if kind in FLEETS:
                assert profiles is not None, "a plain setup starts first (it calibrates the sizes)"
                binary = None
                if kind == "patched":
                    from llamafleet_testbed.llama_build import build

                    binary = str(await asyncio.to_thread(build, patched=True))
                docs = fleet_docs(model, plan, profiles.declared, binary)
                config: FleetConfig = parse_documents(docs, "bench", run_dir)
                setup = Fleet(config, folder, name=kind)
            else:
                pods = 1 if kind == "plain" else plan.pods
                setup = PlainPods(kind, resolved, folder, pods, sglang=kind == "sglang")
            say(f"{model}: starting {kind}")
            started = time.perf_counter()
            setups[kind] = setup
            await setup.start()
            seconds[kind] = time.perf_counter() - started
            if profiles is None:
                measure = prefix_tokens_on(setup.servers[0])
                chars = {s: await asyncio.to_thread(chars_for_tokens, s, measure) for s in plan.sizes}
                result["calibration"] = {str(s): {"chars": c, "tokens": await asyncio.to_thread(measure, c)}
                                         for s, c in chars.items()}
                profiles = make_profiles(chars, plan)
                result["minimum_prefill"] = await minimum_for(setup.servers[0], plan, model)
        assert profiles is not None
        started = time.perf_counter()
        as_is = await run_as_is(setups, model, profiles, say)
        for kind in setups:  # the interleaved runs' time, shared out evenly
            seconds[kind] += (time.perf_counter() - started) / len(setups)
        for kind, setup in list(setups.items()):
            started = time.perf_counter()
            result["setups"][kind] = await run_setup(setup, kind, model, profiles, plan, say, as_is[kind])
            if isinstance(setup, Fleet):
                result["snapshots_enabled_by_bench"] = setup.snapshots_enabled_here
            await setups.pop(kind).stop()
            result["setups"][kind]["seconds"] = seconds[kind] + time.perf_counter() - started
    finally:
        for setup in setups.values():
            await setup.stop()
    if set(FLEETS) & set(plan.setups) and plan.flash_attention != BASELINE_FLASH_ATTENTION:
        assert profiles is not None
        say(f"{model}: cold reference runs with the fleet's own command line (flash attention "
            f"{plan.flash_attention}): greedy agreement compares like with like")
        result["reference"] = await cold_reference(resolved, run_dir / model / "reference", profiles, model)
    return result


async def cold_reference(resolved: Resolved, folder: Path, profiles: Profiles, model: str) -> dict[str, Any]:
    """The 14K scenarios' requests (three sessions as they are and declared, the later day), each
    computed cold (`cache_prompt` off) by plain servers running exactly the fleet's command line.

    (a) is the agreement reference when it runs the fleet's flags. When it does not (flash attention
    on against the fleet's off), its greedy outputs differ by arithmetic, not by anything a restore
    did: the dense tiny model's agree at ~22% of positions at 14K tokens of context. Two servers, two
    requests at a time; the larger sizes are left out (a 32K-token cold prefill takes ~40 s here)."""
    setup = PlainPods("reference", resolved, folder, 2, sglang=False, flash_attention=None)
    await setup.start()
    try:
        async with http_pool.async_client(timeout=httpx.Timeout(30.0, read=900.0)) as http:
            lanes = asyncio.Semaphore(len(setup.servers))

            async def cold(i: int, body: dict[str, Any]) -> dict[str, Any]:
                async with lanes:
                    server = setup.servers[i % len(setup.servers)]
                    return (await stream_chat(http, server, {**body, "cache_prompt": False})).summary()

            async def replay(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return list(await asyncio.gather(*(cold(i, b) for i, b in enumerate(bodies))))

            assert profiles.day1 is not None and profiles.day2 is not None
            return {
                "as_is": [await replay(sc.three_bodies(p, model, f"as-is/{r}")) for r, p in
                          enumerate(profiles.as_is)],
                "declared": [await replay(sc.three_bodies(p, model, f"declared/{r}")) for r, p in
                             enumerate(profiles.declared)],
                "later_day": await replay(sc.day_bodies(profiles.day1, profiles.day2, model, "day")),
            }
    finally:
        await setup.stop()


def _kv(model: str) -> dict[str, Any]:
    from llamafleet_testbed.bench.stats import kv_shape
    from llamafleet_testbed.tinymodel_recipes import RECIPES

    r = RECIPES[model]
    shape = kv_shape(r.arch, r.n_layer, r.n_embd, r.n_head, r.n_head_kv, head_dim=r.head_dim,
                     full_attention_interval=r.full_attention_interval)
    return {"bytes_per_token": shape.bytes_per_token, "attention_layers": shape.attention_layers,
            "arch": r.arch}

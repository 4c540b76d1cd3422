"""`llamafleet bench later-days`: a real agent client's later days and first sessions, against plain.

The requests are Hermes Agent's own layout (`hermes_layout`: its 18 tools and system prompt, the date
three lines before the end of the head), one workspace, one question a day. Per model, one run each:

- **first session** of a head never seen: the fleet (first sight: prefill the head alone, save its
  stages, extend) against one plain llama-server with the fleet pods' exact command line (`same flags`),
  and against one with flash attention on (`fa on`, upstream's CPU default), so the two parts of the
  difference are reported apart: the first-sight path, and the pods' flash-attention setting.
- **pods restarted**: day 1, every pod restarted, day 2 (measured), every pod restarted, day 3
  (measured). The plain server is restarted at the same points.
- **whole fleet restarted**: another fleet and state folder; day 1, the fleet stopped and started again
  (pods, agents, gateway and an in-memory index: nothing but the pods' snapshot folders survives),
  day 2 (measured), again, day 3 (measured).
- **3rd concurrent session**, same day, prompts as Hermes sends them (`scenarios.three_sessions`): a
  fresh fleet against the seed table's plain baseline (one server, flash attention on).

Every figure is a time to first token, and the README's ratios are plain over fleet in the same run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from llamafleet_core import http_pool
from llamafleet_local.up.config import FleetConfig, parse_documents
from llamafleet_local.up.resolve import Resolved, resolve
from llamafleet_testbed.bench import scenarios as sc
from llamafleet_testbed.bench.client import Reply, stream_chat
from llamafleet_testbed.bench.later_days_report import first_medians, markdown, ratios
from llamafleet_testbed.bench.plan import Plan, fleet_docs
from llamafleet_testbed.bench.setups import BASELINE_FLASH_ATTENTION, Fleet, PlainPods
from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec

DAY1 = dt.date(2026, 11, 30)
QUESTIONS = ("Which tests cover the parser?", "Summarize yesterday's failing build.",
             "Rename the config loader and fix its callers.")
MAX_TOKENS = 24  # enough positions for the greedy agreement (later_days_report.fleet_agreement)
TIMEOUT = httpx.Timeout(60.0, read=900.0)


def day_body(model: str, day: int, workspace: str) -> dict[str, Any]:
    """Hermes's request on day `day` (0-based) in `workspace`, with a short answer."""
    spec = WorkloadSpec(workspace=workspace, day=DAY1 + dt.timedelta(days=day))
    body = hermes_profile(spec, model=model).request(model, QUESTIONS[day % 3], max_tokens=MAX_TOKENS)
    # Greedy, so that the fleet's answers can be compared with plain's (`fleet_agreement`): Hermes's
    # own sampling would make every answer differ; the prompt is its own either way.
    return {**body, "temperature": 0}


class FleetRun:
    """A fleet that can be restarted whole: the same state folder, a new run folder and a new in-memory
    index each start (what a whole-fleet restart with a Redis without persistence leaves)."""

    def __init__(self, config: FleetConfig, run_dir: Path, state_dir: Path) -> None:
        self.config, self.run_dir, self.state_dir = config, run_dir, state_dir
        self.setup: Fleet | None = None
        self.starts = 0

    async def start(self) -> str:
        self.starts += 1
        self.setup = Fleet(self.config, self.run_dir / f"start-{self.starts}", self.state_dir)
        await self.setup.start()
        await _listed(self.setup)
        return self.setup.url

    async def restart_pods(self) -> str:
        assert self.setup is not None
        await self.setup.restart_all()
        return self.setup.url

    async def restart_whole(self) -> str:
        await self.stop()
        return await self.start()

    async def stop(self) -> None:
        if self.setup is not None:
            await self.setup.stop()
            self.setup = None

    def actions(self) -> list[str]:
        """The gateway's action per finished request, from its logs (every start's), in order."""
        out = []
        for log in sorted(self.run_dir.glob("start-*/gateway.log")):
            for line in log.read_text(errors="replace").splitlines():
                if '"request finished"' in line:
                    rec = json.loads(line)
                    out.append(f"{rec.get('action')}/{rec.get('branch')}")
        return out


async def _listed(setup: Fleet, timeout: float = 30.0) -> None:
    """Until the new gateway has listed every pod's snapshots (it does within a second of seeing the
    pods): a later day's first session comes hours after a restart, not within its first second."""
    gateway: Any = setup.fleet.app.state.gateway
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        flow = gateway.snapshots
        if flow is not None and not flow.resync.pending(await gateway.discovery.endpoints()):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the gateway did not list every pod's snapshots within {timeout:.0f}s")


def _summary(reply: Reply) -> dict[str, Any]:
    return {"ttft_s": round(reply.ttft_s, 4), "status": reply.status, "cache_n": reply.cache_n,
            "prompt_n": reply.prompt_n, "action": reply.headers.get("x-llamafleet-action", ""),
            "error": reply.error[:200], "pieces": reply.pieces}


async def plain_days(plain: PlainPods, model: str) -> dict[str, Any]:
    """The plain server through the same days: restarted between them, as the fleet's pods are."""
    out: dict[str, Any] = {}
    async with http_pool.async_client(timeout=TIMEOUT) as http:
        for day in range(3):
            if day:
                await plain.restart_all()
            body = day_body(model, day, "/home/dev/p")
            out[f"day{day + 1}"] = _summary(await stream_chat(http, plain.url, body))
    return out


async def fleet_days(run: FleetRun, model: str, restart: Callable[[], Awaitable[str]],
                     workspace: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    url = await run.start()
    async with http_pool.async_client(timeout=TIMEOUT) as http:
        for day in range(3):
            if day:
                url = await restart()
            out[f"day{day + 1}"] = _summary(await stream_chat(http, url, day_body(model, day, workspace)))
    out["actions"] = run.actions()
    await run.stop()
    return out


async def later_days(models: tuple[str, ...], run_dir: Path, say: Callable[[str], None], *,
                     patched: bool = False) -> dict[str, Any]:
    """`patched`: the fleets run the project's patched build (its flags as `up` renders them for it);
    the plain servers stay upstream."""
    raw: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M"), "models": {}, "patched": patched}
    plan = Plan(models=models)
    for model in models:
        config = parse_documents(fleet_docs(model, plan, []), "later-days", run_dir)
        resolved = resolve(config, say)  # the plain servers' binary and command line
        if patched:
            from llamafleet_testbed.llama_build import build

            binary = str(await asyncio.to_thread(build, patched=True))
            config = parse_documents(fleet_docs(model, plan, [], binary), "later-days", run_dir)
        result: dict[str, Any] = {}
        for name, fa in (("plain_same_flags", None), ("plain_fa_on", BASELINE_FLASH_ATTENTION)):
            plain = PlainPods(f"{name}-{model}", resolved, run_dir / model / name, 1, sglang=False,
                              flash_attention=fa)
            await plain.start()
            try:
                result[name] = await plain_days(plain, model)
            finally:
                await plain.stop()
            say(f"{model} {name}: " + ", ".join(f"{d} {r['ttft_s']:.3f} s" for d, r in result[name].items()))
        pods = FleetRun(config, run_dir / model / "pods", run_dir / model / "pods-state")
        result["fleet_pods_restarted"] = await fleet_days(pods, model, pods.restart_pods, "/home/dev/p")
        whole = FleetRun(config, run_dir / model / "whole", run_dir / model / "whole-state")
        result["fleet_whole_restarted"] = await fleet_days(whole, model, whole.restart_whole, "/home/dev/p")
        result["third_session"] = await third_sessions(config, resolved, run_dir / model, model)
        result["first_sessions"] = await first_sessions(config, resolved, run_dir / model, model)
        say(f"{model} first sessions of never-seen heads: " + ", ".join(
            f"{k} {t:.3f} s" for k, t in first_medians(result).items()))
        say(f"{model} 3rd concurrent session: plain {result['third_session']['plain'][2]['ttft_s']:.3f} s, "
            f"fleet {result['third_session']['fleet'][2]['ttft_s']:.3f} s")
        for name in ("fleet_pods_restarted", "fleet_whole_restarted"):
            days = {d: r for d, r in result[name].items() if d.startswith("day")}
            say(f"{model} {name}: " + ", ".join(
                f"{d} {r['ttft_s']:.3f} s {r['action']}" for d, r in days.items()))
        raw["models"][model] = result
    return raw


async def third_sessions(config: FleetConfig, resolved: Resolved, folder: Path, model: str) -> dict[str, Any]:
    """Three concurrent sessions of one never-seen Hermes head, on plain and on a fresh fleet."""
    profile = hermes_profile(WorkloadSpec(workspace="/home/dev/burst", day=DAY1), model=model)
    out: dict[str, Any] = {}
    plain = PlainPods(f"burst-plain-{model}", resolved, folder / "burst-plain", 1, sglang=False)
    fleet = Fleet(config, folder / "burst-fleet")
    for name, setup in (("plain", plain), ("fleet", fleet)):
        await setup.start()
        try:
            async with http_pool.async_client(timeout=TIMEOUT) as http:
                replies = await sc.three_sessions(http, setup.url, profile, model, "burst")
            out[name] = [_summary(r) for r in replies]
        finally:
            await setup.stop()
    return out


FIRST_ROUNDS = 3


def new_head_body(model: str, key: str) -> dict[str, Any]:
    """Hermes's request with a head no setup has seen: its first tool's description and its system
    prompt start with `key` (the head's very first block differs whether the template writes the tools
    or the system prompt first, or drops the tools as SmolLM2's does, so nothing of it is held, and it
    is a family of its own)."""
    body = day_body(model, 0, "/home/dev/first")
    first = json.loads(json.dumps(body["tools"][0]))
    first["function"]["description"] = f"[{key}] " + first["function"]["description"]
    body["tools"] = [first, *body["tools"][1:]]
    system = dict(body["messages"][0])
    system["content"] = f"[{key}] " + system["content"]
    body["messages"] = [system, *body["messages"][1:]]
    return body


async def first_sessions(config: FleetConfig, resolved: Resolved, folder: Path, model: str) -> dict[str, Any]:
    """First sessions of never-seen heads, alternating over plain (the pods' own flags), plain with
    flash attention on, and a fleet, `FIRST_ROUNDS` rounds: one sample each moved ~15% with the
    machine, more than the difference measured."""
    setups: dict[str, PlainPods | Fleet] = {
        "plain_same_flags": PlainPods(f"first-plain-{model}", resolved, folder / "first-plain", 1,
                                      sglang=False, flash_attention=None),
        "plain_fa_on": PlainPods(f"first-fa-{model}", resolved, folder / "first-fa", 1, sglang=False),
        "fleet": Fleet(config, folder / "first-fleet"),
    }
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    try:
        for setup in setups.values():
            await setup.start()
        async with http_pool.async_client(timeout=TIMEOUT) as http:
            for r in range(FIRST_ROUNDS):
                for name, setup in setups.items():
                    reply = await stream_chat(http, setup.url, new_head_body(model, f"{name}-{r}"))
                    out[name].append(_summary(reply))
    finally:
        for setup in setups.values():
            await setup.stop()
    return out


def main(models: tuple[str, ...], out: Path, run_dir: Path, say: Callable[[str], None], *,
         patched: bool = False) -> dict[str, Any]:
    raw = asyncio.run(later_days(models, run_dir, say, patched=patched))
    raw["ratios"] = ratios(raw)
    out.mkdir(parents=True, exist_ok=True)
    (out / "later_days.json").write_text(json.dumps(raw, indent=2) + "\n")
    pods = "the fleets on the patched llama-server, " if patched else ""
    title = f"Later days and first sessions, {raw['started']}, {pods}one run each."
    (out / "later_days.md").write_text(f"{title}\n\n" + markdown(raw))
    return raw

"""A second gateway replica over the same pods and Redis, killed with SIGKILL mid-workload.

The second replica is a real `llamafleet router` process (so that SIGKILL is a real kill: its sockets
close, its Redis slot leases stay behind until their TTL), configured like `up`'s own gateway but with a
short lease TTL, so that the expiry of a dead replica's leases is seen within the scenario. Clients
alternate between the two and retry a request that got no answer on the other replica.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import yaml

from llamafleet_local.redis_server import free_port
from llamafleet_router.scheduling.config import DEFAULT_CONFIG
from llamafleet_testbed.reliability.bed import Bed, kill, until
from llamafleet_testbed.reliability.client import Load
from llamafleet_testbed.reliability.outcome import ScenarioResult

ROUTER = [sys.executable, "-m", "llamafleet_cli.cli", "router"]
LEASE_TTL_S = 4.0  # the second replica's slot leases (the default, 300 s, outlives any test)


def start_replica(
    bed: Bed, log: Path, env: dict[str, str] | None = None, lease_ttl_s: float | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """`llamafleet router` over the fleet's pods and Redis (`env`: more `LLAMAFLEET_ROUTER_*` settings;
    `lease_ttl_s`: its slot leases' TTL instead of the default's 300 s); returns the process and its
    URL."""
    fleet = bed.fleet
    assert fleet.index is not None and fleet.index.redis_url is not None
    port = free_port()
    pods = ",".join(f"{p.layout.llama_url}|{p.layout.agent_url}" for p in fleet.pods)
    env = {**os.environ, "LLAMAFLEET_ROUTER_AGENT_TOKEN_FILE": str(fleet.token_file),
           "LLAMAFLEET_ROUTER_POLL_INTERVAL": "0.5", "LLAMAFLEET_ROUTER_INDEX_PING_INTERVAL": "0.5",
           **({"LLAMAFLEET_ROUTER_POD_API_KEY_FILE": str(fleet.pod_api_key_file)}
              if fleet.pod_api_key_file is not None else {}),
           **(env or {})}
    argv = [*ROUTER, "--pods", pods, "--redis", fleet.index.redis_url, "--host", "127.0.0.1",
            "--port", str(port), "--model-name", fleet.model]
    if lease_ttl_s is not None:
        config = log.with_suffix(".scheduling.yaml")
        config.write_text(yaml.safe_dump({**DEFAULT_CONFIG, "leases": {"ttl_s": lease_ttl_s}}))
        argv += ["--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return proc, f"http://127.0.0.1:{port}"


async def kill_gateway(bed: Bed) -> ScenarioResult:
    """Two replicas; clients alternate and retry on the other; replica B is SIGKILLed mid-workload, at a
    moment it holds a slot lease: that lease must expire within its TTL (nothing releases it any more)."""
    r = ScenarioResult("kill -9 gateway replica",
                       "SIGKILL one of 2 gateway replicas; clients retry on the other")
    started = time.monotonic()
    proc, url_b = start_replica(bed, bed.fleet.run_dir / "gateway-b.log", lease_ttl_s=LEASE_TTL_S)
    mine = bed.gateway.leases.replica if bed.gateway.leases is not None else ""

    async def leased_by_b() -> list[str]:
        return [f"{ref.pod_uid}#{ref.slot}" for ref, holder in await bed.slot_holders()
                if holder is not None and holder != mine]

    try:
        async def healthy() -> bool:
            try:
                return (await bed.http.get(url_b + "/health", timeout=2.0)).status_code == 200
            except Exception:
                return False

        up_s = await until(healthy, 30.0, every=0.1)
        r.checks["replica_up_s"] = None if up_s is None else round(up_s, 2)
        if up_s is None:
            r.problems.append("the second replica did not become healthy within 30s")
            return r
        body = lambda i: bed.body(i, stream=i % 4 != 3, max_tokens=32)  # noqa: E731
        load = Load(bed.http, [bed.url, url_b], body, count=400, concurrency=4, timeout=30.0, attempts=2)
        running = asyncio.create_task(load.run())
        await load.wait_done(10)
        held_by_b = await _freeze_holding(proc.pid, leased_by_b)
        killed_at = time.monotonic()
        kill(proc.pid)
        expiry = asyncio.create_task(until(lambda: _none(leased_by_b()), LEASE_TTL_S + 2.0, every=0.1))
        await asyncio.to_thread(proc.wait, 10)
        # The load goes on until the dead replica's leases are gone: its retried requests and the ones
        # after them run on the other replica while those slots are still leased, and after.
        expired_s = await expiry  # seconds from the kill until none of its leases was left
        load.stop.set()
        results = await running
    finally:
        if proc.poll() is None:
            kill(proc.pid)
            proc.wait(10)
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    await bed.check_leaks(r)
    retried = [s for s in results if s.attempts > 1]
    r.checks.update({
        "retried_on_other_replica": len(retried),
        "answered_by_b_before_kill": sum(1 for s in results if s.gateway == url_b and s.ended < killed_at),
        "answered_after_kill": sum(1 for s in results if s.ended > killed_at),
        "longest_s": round(max((s.ended - s.started for s in results), default=0.0), 2),
        "leases_of_killed_replica": len(held_by_b),
        "its_leases_expired_after_s": None if expired_s is None else round(expired_s, 2),
    })
    r.expect(r.lost == 0 and r.other_failed == 0,
             f"{r.other_failed} failed and {r.lost} lost with one replica killed")
    r.expect(bool(retried), "no request needed a retry: the kill did not hit the workload")
    r.expect(bool(held_by_b), "the killed replica held no slot lease: its leases' expiry went untested")
    # Polled every 0.1 s, and a lease's TTL runs from its last acquire, at or before the kill.
    r.expect(expired_s is not None and expired_s <= LEASE_TTL_S + 0.5,
             f"the killed replica's leases {held_by_b} outlived their {LEASE_TTL_S:.0f}s TTL")
    return r


async def _freeze_holding(pid: int, leased: Callable[[], Awaitable[list[str]]], limit: float = 10.0,
                          ) -> list[str]:
    """Stop process `pid` (SIGSTOP) at a moment it holds a slot lease, so that the kill that follows
    leaves that lease behind (a frozen replica releases nothing); its leases, or [] after `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        kill(pid, signal.SIGSTOP)
        held = await leased()
        if held:
            return held
        kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.02)
    return []


async def _none(pending: Awaitable[list[str]]) -> bool:
    return not await pending

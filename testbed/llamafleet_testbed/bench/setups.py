"""The three setups a benchmark compares, started and stopped the same way.

- `plain`: one llama-server, the fleet's slots per pod, the exact pod command line (`podspec`) but no
  router: what one unmodified server does for agent sessions.
- `sglang`: the same number of plain pods as the fleet behind sglang-router's cache-aware policy, the
  strongest peer router that installs here. `--balance-abs-threshold 1` so that it spreads load at all
  with a handful of sessions (with the default of 64 every request goes to one worker: measured.md).
- `llamafleet`: `LocalFleet` (pods with agents, the gateway in-process) over the same pods and slots.
- `patched`: the same fleet on the patched llama-server (`patches/llama.cpp`), with a unified KV pool:
  `prefixSharing: auto` finds `--slot-attach` and `--cache-prefix` in its `--help` and turns both on.

Every server runs the same renderer's argv (same `-np`, `-c`, KV types, checkpoints, `-t`), so
differences come from routing and snapshots, with one exception: the plain pods keep flash attention on
(`BASELINE_FLASH_ATTENTION`, what upstream's default `auto` picks on CPU), their fastest setting for the
full prefills they mostly do, whatever the fleet's pods run (a CPU fleet runs it off: `devices.py`).
Each setup exposes `url` (where clients send) and `servers` (the llama-server URLs, for `/metrics` and
`/tokenize`).
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from pathlib import Path
from typing import Any

from llamafleet_core import http_pool
from llamafleet_local.redis_server import free_port
from llamafleet_local.up import LocalFleet, UpOptions
from llamafleet_local.up.config import FleetConfig
from llamafleet_local.up.pods import layout, server_argv
from llamafleet_local.up.procs import Child, stop_all
from llamafleet_local.up.progress import Reporter
from llamafleet_local.up.resolve import Resolved

SETUPS = ("plain", "sglang", "llamafleet", "patched")
LABELS = {"plain": "(a) llama-server", "sglang": "(b) sglang-router", "llamafleet": "(c) llamafleet",
          "patched": "(d) llamafleet, patched pods"}
# The setups that are a llamafleet fleet: (c) on upstream pods, (d) on the patched build's pods
FLEETS = ("llamafleet", "patched")


BASELINE_FLASH_ATTENTION = "on"


class PlainPods:
    """`n` llama-servers with the fleet's own command line (no agent, no router), optionally behind
    sglang-router. `restart_all()` restarts every server: their KV cache is gone, as after a rollout."""

    def __init__(self, name: str, resolved: Resolved, run_dir: Path, n: int, *, sglang: bool,
                 flash_attention: str | None = BASELINE_FLASH_ATTENTION) -> None:
        """`flash_attention` None: exactly the fleet's command line (a cold reference for agreement)."""
        self.name = name
        self.run_dir = run_dir
        self.layouts = [layout(name, i, run_dir) for i in range(n)]
        spec = resolved.spec if flash_attention is None else resolved.spec.model_copy(
            update={"flash_attention": flash_attention})
        self.children = [
            Child(f"{lay.name} llama-server",
                  server_argv(resolved.binary, spec, lay, resolved.model),
                  run_dir / f"{lay.name}.llama-server.log")
            for lay in self.layouts
        ]
        self.router: Child | None = None
        if sglang:
            port = free_port()
            self.router = Child("sglang-router", [
                sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port),
                "--worker-urls", *self.servers, "--policy", "cache_aware", "--balance-abs-threshold", "1",
                "--log-level", "warn", "--request-timeout-secs", "1800",
            ], run_dir / "sglang-router.log")
            self.url = f"http://127.0.0.1:{port}"
        else:
            self.url = self.servers[0]
        self.http = http_pool.async_client(timeout=30.0)

    @property
    def servers(self) -> list[str]:
        return [lay.llama_url for lay in self.layouts]

    async def start(self, timeout: float = 180.0) -> None:
        for lay in self.layouts:
            lay.snapshot_dir.mkdir(parents=True, exist_ok=True)
        for child in self.children:
            child.start()
        for child, url in zip(self.children, self.servers, strict=True):
            await child.wait_http(url + "/health", self.http, timeout)
        if self.router is not None:
            self.router.start()
            await self.router.wait_http(self.url + "/health", self.http, timeout)

    async def restart_all(self) -> None:
        await stop_all(self.children)
        for child in self.children:
            child.start()
        for child, url in zip(self.children, self.servers, strict=True):
            await child.wait_http(url + "/health", self.http, 180.0)
        if self.router is not None:  # it marks restarted workers unhealthy for a while: wait for it
            await self.router.wait_http(self.url + "/health", self.http, 60.0)

    async def stop(self) -> None:
        if self.router is not None:
            await self.router.stop()
        await stop_all(self.children)
        await self.http.aclose()

    def snapshot_bytes(self) -> int:
        return 0


class Fleet:
    """`LocalFleet` as a setup. The gateway's snapshot flow is turned on here when the embedding
    `create_app` has not done it already (it needs the agents' token, which only the fleet knows)."""

    def __init__(self, config: FleetConfig, run_dir: Path, state_dir: Path | None = None,
                 name: str = "llamafleet") -> None:
        """`state_dir`: where the pods keep their snapshots (default: the run folder, a cold start)."""
        self.name = name
        options = UpOptions(port=0, index="memory", run_dir=run_dir, restart=False, state_dir=state_dir)
        self.fleet = LocalFleet(config, options, Reporter(io.StringIO()))
        self.url = ""
        self.snapshots_enabled_here = False
        self.gateway_log = run_dir / "gateway.log"  # the in-process gateway's JSON log

    @property
    def servers(self) -> list[str]:
        return [p.layout.llama_url for p in self.fleet.pods]

    async def start(self, timeout: float = 600.0) -> None:
        await self.fleet.start()
        await self.fleet.wait_ready(timeout)
        self.url = self.fleet.gateway_url
        await self._gateway_sees_every_pod()
        gateway: Any = self.fleet.app.state.gateway
        if gateway.snapshot_config is None:
            from llamafleet_router.snapshots import SnapshotConfig

            gateway.enable_snapshots(SnapshotConfig(token=self.fleet.agent_token))
            self.snapshots_enabled_here = True

    async def _gateway_sees_every_pod(self, timeout: float = 30.0) -> None:
        """The fleet is ready when its pods are up and warm, but the gateway's discovery polls them on its
        own schedule: a request in between gets 503 `no_pod_available`. Wait until `/health` lists every
        pod as up, so the first measured request meets the whole fleet."""
        deadline = time.monotonic() + timeout
        async with http_pool.async_client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                resp = await http.get(self.url + "/health")
                if resp.status_code == 200 and resp.json().get("pods_up") == len(self.fleet.pods):
                    return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"the gateway did not see all {len(self.fleet.pods)} pods within {timeout:.0f}s")

    async def restart_all(self) -> None:
        from llamafleet_local.up.supervise import restart, rewarm

        before = await self._epochs()
        for pod in self.fleet.pods:
            await restart(self.fleet, pod)
        # As `up` does after a restart: warm again (every pod is restarted, so a SharedPrefix comes from
        # the snapshot files the pods kept), then declare, which makes the pod routable.
        for pod in self.fleet.pods:
            if cold := await rewarm(self.fleet, pod):
                raise RuntimeError(f"{pod.name} is not warm after its restart: {'; '.join(cold)}")
        # As at start: "every pod restarted" means the gateway routes to every pod again, in its new
        # epoch. A request sent while a pod is still down in the gateway's view could not find that
        # pod's snapshots (the gateway records them again when it sees the pod back).
        # A restart faster than the gateway's poll may go unseen (same epoch): then every pod up, a few
        # polls later, is all there is to wait for.
        started = time.monotonic()
        while time.monotonic() < started + 30.0:
            now = await self._epochs()
            restarted = all(now.get(uid, -1) > epoch for uid, epoch in before.items())
            if now.keys() == before.keys() and (restarted or time.monotonic() > started + 2.0):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the gateway did not see every restarted pod up within 30 s")

    async def _epochs(self) -> dict[str, int]:
        """Epoch of every pod the gateway routes to now, by uid."""
        discovery: Any = self.fleet.app.state.gateway.discovery
        return {p.endpoint.uid: p.endpoint.pod.epoch for p in await discovery.endpoints() if p.ready}

    async def stop(self) -> None:
        await self.fleet.stop()

    def snapshot_bytes(self) -> int:
        """Bytes of snapshot files on every pod (what the fleet keeps on disk, beside the slots)."""
        return sum(f.stat().st_size for p in self.fleet.pods for f in p.layout.snapshot_dir.glob("*.bin"))


Setup = PlainPods | Fleet

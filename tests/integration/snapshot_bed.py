"""Pods with snapshot agents for the gateway's snapshot tests: a real llama-server, its real agent served
over a loopback socket (peers pull across a real connection), and helpers to damage snapshots.

`AgentPod.spec` is the `url|agent_url` string the gateway's static discovery takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.networks import LOOPBACK_NETWORKS
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from llamafleet_local.llama_process import LlamaServerProcess
from llamafleet_router.inprocess import serve
from tests.fixtures.llama import StartLlamaServer

TOKEN = "snapshot-test-token"
SERVER_ARGS = ("-fa", "on", "--no-cache-idle-slots", "--metrics")  # as a rendered pod spec has them


@dataclass
class AgentPod:
    server: LlamaServerProcess
    agent_url: str
    snapshot_dir: Path

    @property
    def spec(self) -> str:
        return f"{self.server.url}|{self.agent_url}"

    def files(self, prefix: str = "") -> list[Path]:
        return sorted(p for p in self.snapshot_dir.glob(f"{prefix}*.bin"))

    async def erase_slots(self, http: httpx.AsyncClient) -> None:
        """Empty every slot, so the next request can only reuse a prefix through a snapshot."""
        llama = LlamaClient(self.server.url, http)
        for slot in range(self.server.slots):
            await llama.erase_slot(slot)


class DiesMidTransfer:
    """Wraps an agent app: snapshot file downloads stop after `limit` bytes and the connection drops,
    as when the peer's pod dies while another pod pulls from it."""

    def __init__(self, app: ASGIApp, limit: int = 64 * 1024) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).endswith("/file"):
            await self.app(scope, receive, send)
            return
        sent = 0

        async def cut(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if sent + len(body) > self.limit:
                    await send({"type": "http.response.body", "body": body[: self.limit - sent],
                                "more_body": True})
                    raise ConnectionAbortedError("the peer died mid-transfer")
                sent += len(body)
            await send(message)

        await self.app(scope, receive, cut)


class SaveGate:
    """Wraps agent apps: while closed, slot saves wait at the gate. A first-sight build saves its first
    stage after its first prefill, with every stage's flight open; a test holds it there to start what
    must find the build under way, instead of guessing how long the prefill takes. Open by default."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._waiting = asyncio.Event()

    def close(self) -> None:
        self._open.clear()
        self._waiting.clear()

    def open(self) -> None:
        self._open.set()

    async def holding(self, timeout: float = 120.0) -> None:
        """Until a save waits at the closed gate."""
        await asyncio.wait_for(self._waiting.wait(), timeout)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def gated(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope.get("path") == "/v1/snapshots/save":
                while not self._open.is_set():
                    self._waiting.set()
                    await self._open.wait()
            await app(scope, receive, send)
        return gated


@contextlib.asynccontextmanager
async def agent_pod(
    start: StartLlamaServer, model: Path, name: str, root: Path, http: httpx.AsyncClient, *,
    slots: int = 4, flaky: bool = False, saves: SaveGate | None = None, ctx: int | None = None,
    flags: tuple[str, ...] = (),
) -> AsyncIterator[AgentPod]:
    """A llama-server named `name` with its agent on a socket (`flaky`: the agent dies mid-transfer;
    `saves`: its slot saves pass that gate; `ctx`: its `-c`, default the factory's; `flags`: more of
    llama-server's arguments)."""
    snapdir = root / "snapshots"
    snapdir.mkdir(parents=True, exist_ok=True)
    server = start(model, slots=slots, ctx=ctx, slot_save_path=snapdir,
                   extra_args=("-a", name, *SERVER_ARGS, *flags))
    settings = AgentSettings(
        llama_url=server.url, snapshot_dir=snapdir, model_file=model, slots=slots, flash_attn="on",
        pod_name=root.name, model_name=name, peer_networks=list(LOOPBACK_NETWORKS),
    )
    app: Any = create_app(settings, llama=LlamaClient(server.url, http), http=http,
                          registry=CollectorRegistry(), token=TOKEN)
    served: Any = DiesMidTransfer(app) if flaky else app  # any ASGI app; uvicorn does not mind
    if saves is not None:
        served = saves.wrap(served)
    async with serve(served) as url:
        yield AgentPod(server, url, snapdir)


def damage(pod: AgentPod, name: str, how: str) -> None:
    """Break snapshot `name` on `pod` the way a fault case needs."""
    binary, manifest_path = pod.snapshot_dir / f"{name}.bin", pod.snapshot_dir / f"{name}.json"
    if how == "corrupt":
        data = bytearray(binary.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        binary.write_bytes(bytes(data))
    elif how == "truncate":
        whole = binary.read_bytes()
        binary.write_bytes(whole[: len(whole) // 2])
    elif how in ("other_model", "other_kv"):
        manifest = json.loads(manifest_path.read_text())
        if how == "other_model":
            manifest["fingerprint"]["model_sha256"] = "0" * 64
        else:
            manifest["fingerprint"]["cache_type_k"] = "q8_0"
        # Signed as the agent would: the case is a snapshot that does not fit, not an unsigned one.
        signed = sign_manifest(SnapshotManifest.model_validate(manifest), manifest_key(TOKEN))
        manifest_path.write_text(signed.model_dump_json())
    else:
        raise ValueError(how)


async def metric(http: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    text = (await http.get(url + "/metrics")).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        got = head[len(name):].strip("{}")
        if ",".join(sorted(got.split(","))) == want or (not want and not got):
            return float(value)
    return 0.0


async def metric_reaches(http: httpx.AsyncClient, url: str, name: str, want: float, *,
                         timeout: float = 60.0, **labels: str) -> float:
    """The gateway's sample once it is at least `want`, or what it is at the deadline (the caller's
    assertion then says what never came)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await metric(http, url, name, **labels)) < want:
        if asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.02)
    return got

"""Pods for the agent tests: a real llama-server plus its agent, run in-process.

One pod's agent is reached through httpx's ASGI transport; a peer that another agent pulls from is served
by uvicorn on a free loopback port, so the pull crosses a real socket like it does between pods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.agent_client import AgentClient
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.networks import LOOPBACK_NETWORKS
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from llamafleet_local.redis_server import free_port

TOKEN = "agent-test-token"
KEY = manifest_key(TOKEN)  # the manifest key the agents derive from TOKEN
# Pinned like a rendered pod spec would: the agent is told the same settings the server runs with.
SERVER_ARGS = ("-fa", "on", "--no-cache-idle-slots")
EXTENSION = [13, 785, 4226, 374]  # a few ordinary token ids appended to the prefix in probes
PROMPT = "You are a careful assistant for a fleet of language model servers. Answer briefly. " * 40


@dataclass
class Pod:
    server: Any  # LlamaServerProcess
    llama: LlamaClient
    app: Starlette
    settings: AgentSettings
    agent: AgentClient  # talks to the app through ASGI, with the right token
    raw: httpx.AsyncClient  # the same transport, no token: for auth and malformed-request tests
    prefix: list[int] = field(default_factory=list)  # what a test prefilled, for probes

    @property
    def dir(self) -> Path:
        return self.settings.snapshot_dir

    async def cache_n(self, prompt: list[int], slot: int) -> int:
        """Tokens of `prompt` that `slot` already held: the server's own `timings.cache_n`.

        `/slots` cannot tell: it reports a slot's token count only once a task ran there, and a restore
        is not a task. So the probe is a tiny completion pinned to the slot (it changes the slot).
        """
        body = {"prompt": prompt, "n_predict": 1, "id_slot": slot, "cache_prompt": True}
        resp = await self.llama._call("POST", "/completion", body, timeout=120)
        return int(resp["timings"]["cache_n"])


MakePod = Callable[..., "contextlib.AbstractAsyncContextManager[Pod]"]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=60.0) as client:
        yield client


@pytest.fixture
def make_pod(start_llama_server: Any, tmp_path: Path, http: httpx.AsyncClient) -> MakePod:
    """Start a llama-server on `model` and build its agent (settings overridable for refusal tests)."""
    counter = iter(range(100))

    @contextlib.asynccontextmanager
    async def make(model: Path, *, slots: int = 2, **overrides: Any) -> AsyncIterator[Pod]:
        n = next(counter)
        snapdir = tmp_path / f"pod{n}" / "snapshots"
        snapdir.mkdir(parents=True)
        server = start_llama_server(model, slots=slots, slot_save_path=snapdir, extra_args=SERVER_ARGS)
        values: dict[str, Any] = {
            "llama_url": server.url, "snapshot_dir": snapdir, "model_file": model, "slots": slots,
            "flash_attn": "on", "pod_name": f"pod{n}", "model_name": "tiny",
            "peer_networks": list(LOOPBACK_NETWORKS),  # peers listen on loopback here
        }
        settings = AgentSettings(**{**values, **overrides})
        llama = LlamaClient(server.url, http)
        app = create_app(settings, llama=llama, http=http, registry=CollectorRegistry(), token=TOKEN)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent", timeout=60.0) as raw:
            yield Pod(server, llama, app, settings, AgentClient("http://agent", raw, TOKEN), raw)

    return make


@contextlib.asynccontextmanager
async def serve_over_socket(app: Starlette) -> AsyncIterator[str]:
    """Run `app` under uvicorn on a free port; yields its base URL and stops it afterwards."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.02)
        if not server.started:
            raise RuntimeError("uvicorn did not start the peer agent")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


async def prefill_prefix(pod: Pod, slot: int) -> list[int]:
    """Compute the test prefix alone into `slot` and return its tokens (what a snapshot should hold)."""
    tokens = await pod.llama.tokenize(PROMPT)
    await pod.llama.prefill(tokens, slot, timeout=120)
    return tokens


def write_signed(path: Path, data: dict[str, Any]) -> None:
    """Write manifest `data` at `path` signed as an agent would (a test that edits a manifest means to
    test the check it targets, not the signature)."""
    path.write_text(sign_manifest(SnapshotManifest.model_validate(data), KEY).model_dump_json())

"""Snapshots move between real llama-server pods through their agents, and are reused after restore."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.snapshot import tokens_sha256
from tests.agent.conftest import EXTENSION, TOKEN, MakePod, prefill_prefix, serve_over_socket

pytestmark = pytest.mark.llama


def _snapshot_files(folder: Path) -> list[str]:
    """Everything in a snapshot folder except the agent's model-digest cache (temps included)."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".model-digest.json")


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
async def test_prefix_reused_on_other_pod_when_snapshot_pulled_and_restored(
    make_pod: MakePod, tiny_models: Any, http: Any, kind: str
) -> None:
    """Save on A, pull into B over a socket, restore into B's slot: B then reuses the whole prefix."""
    model: Path = getattr(tiny_models, kind)
    async with make_pod(model) as a, make_pod(model) as b, serve_over_socket(a.app) as a_url:
        tokens = await prefill_prefix(a, slot=1)
        saved = await a.agent.save(1, "prefix-1", pinned=True, tokens=tokens, blocks=["aa", "bb"],
                                   block_chars=4096)
        assert saved.n_tokens == len(tokens) and saved.tokens_sha256 == tokens_sha256(tokens)
        assert saved.fingerprint.model_sha256 == (await b.agent.fingerprint()).model_sha256
        assert (a.dir / "prefix-1.bin").stat().st_size == saved.size

        pulled = await b.agent.pull("prefix-1", a_url)
        assert pulled.sha256 == saved.sha256 and pulled.pinned
        assert [m.name for m in await b.agent.list()] == ["prefix-1"]

        # Control: the same prompt on an empty slot of B computes everything.
        assert await b.cache_n(tokens + EXTENSION, slot=1) == 0
        result = await b.agent.restore("prefix-1", slot=0)
        assert result.n_tokens == len(tokens) and result.total_ms >= result.verify_ms
        assert await b.cache_n(tokens + EXTENSION, slot=0) == len(tokens)

        metrics = (await b.raw.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
        assert 'llamafleet_agent_operations_total{op="restore",outcome="ok"} 1.0' in metrics
        assert 'llamafleet_agent_operations_total{op="pull",outcome="ok"} 1.0' in metrics


async def test_pull_refused_when_pods_differ_in_cache_type(make_pod: MakePod, tiny_models: Any) -> None:
    """The receiving pod runs other KV settings: the pull is refused before any byte lands."""
    async with make_pod(tiny_models.dense) as a, make_pod(tiny_models.dense, cache_type_k="q8_0") as b, \
            serve_over_socket(a.app) as a_url:
        tokens = await prefill_prefix(a, slot=0)
        await a.agent.save(0, "p", tokens=tokens)
        with pytest.raises(AgentError) as err:
            await b.agent.pull("p", a_url)
        assert err.value.status == 409 and "cache_type_k f16 != q8_0" in err.value.reason
        assert _snapshot_files(b.dir) == []


async def test_pull_refused_when_peer_token_wrong(make_pod: MakePod, tiny_models: Any, http: Any) -> None:
    """A peer agent with another shared token answers 401; nothing is stored."""
    async with make_pod(tiny_models.dense) as a, serve_over_socket(a.app) as a_url:
        await prefill_prefix(a, slot=0)
        await a.agent.save(0, "p")
        wrong = AgentClient(a_url, http, "not-the-token")
        with pytest.raises(AgentError) as err:
            await wrong.list()
        assert err.value.status == 401


async def _half_sending_peer(manifest: dict[str, Any], body: bytes) -> tuple[asyncio.Server, str]:
    """A peer that serves the manifest, then promises the whole file but closes after half of it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        path = request.split(b" ")[1]
        if path.endswith(b"/file"):
            head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body[: len(body) // 2])
        else:
            data = json.dumps(manifest).encode()
            head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(data)}\r\ncontent-type: application/json\r\n\r\n"
            writer.write(head.encode() + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def test_no_file_under_real_name_when_peer_dies_mid_transfer(
    make_pod: MakePod, tiny_models: Any
) -> None:
    """Half a file then a closed connection: the pull fails and leaves neither file, manifest nor temp."""
    async with make_pod(tiny_models.dense) as a:
        tokens = await prefill_prefix(a, slot=0)
        manifest = await a.agent.save(0, "p", tokens=tokens)
        body = (a.dir / "p.bin").read_bytes()
        await a.agent.delete("p")  # A receives it back: a real pod whose fingerprint matches
        peer, url = await _half_sending_peer(manifest.model_dump(mode="json"), body)
        try:
            with pytest.raises(AgentError) as err:
                await a.agent.pull("p", url)
        finally:
            peer.close()
            await peer.wait_closed()
        assert err.value.status in (409, 502)
        assert _snapshot_files(a.dir) == []

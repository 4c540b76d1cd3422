"""SharedPrefix warming against real llama-server pods, real agents (over sockets) and a real Redis.

Each pod is a real llama-server plus its agent app served by uvicorn on a loopback port, so pulls
cross a real socket between agents as they do between pods. The prefix is an agent-client-like one
(`llamafleet_testbed.workload`), about 4.5K tokens: large enough that reuse is unmistakable, small enough
that the tests stay fast on two cores.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.agent_client import AgentClient
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.networks import LOOPBACK_NETWORKS
from llamafleet_core.prefix import ChatTemplate, chat_identity
from llamafleet_core.warming import (
    PodWarmState,
    PrefixSource,
    WarmError,
    WarmPod,
    declare_required,
    remove_shared_prefix,
    render_prefix,
    warm_pod,
    warm_shared_prefix,
)
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.agent.conftest import SERVER_ARGS, TOKEN, serve_over_socket

pytestmark = [pytest.mark.llama, pytest.mark.redis]

MODEL = "tiny"
PROFILE = make_profile(WorkloadSpec(prefix_chars=20_000))
SOURCE = PrefixSource(name="agent", model=MODEL, tools=PROFILE.tools,
                      messages=({"role": "system", "content": PROFILE.system_prompt},))
SLOTS = 2


@dataclass
class BedPod:
    warm: WarmPod
    server: Any  # LlamaServerProcess
    llama: LlamaClient
    agent: AgentClient
    dir: Path
    stack: contextlib.AsyncExitStack

    async def chat_cache_n(self, slot: int, question: str) -> tuple[int, int]:
        """(cache_n, prompt tokens) of a full agent request pinned to `slot`: the server's own account."""
        body = PROFILE.request(MODEL, question, max_tokens=1, stream=False)
        body.update(id_slot=slot, cache_prompt=True)
        resp = await self.llama._call("POST", "/v1/chat/completions", body, timeout=120)
        timings = resp["timings"]
        return int(timings["cache_n"]), int(timings["cache_n"]) + int(timings["prompt_n"])


class Bed:
    """Start and stop pods one by one (a test may run at most two llama-servers at once)."""

    def __init__(self, start_llama_server: Any, tmp_path: Path, http: httpx.AsyncClient) -> None:
        self._start = start_llama_server
        self._tmp = tmp_path
        self.http = http
        self.pods: list[BedPod] = []

    async def start(self, model: Path, name: str, **overrides: Any) -> BedPod:
        snapdir = self._tmp / name / "snapshots"
        snapdir.mkdir(parents=True)
        server = self._start(model, slots=SLOTS, slot_save_path=snapdir, extra_args=SERVER_ARGS)
        values: dict[str, Any] = {
            "llama_url": server.url, "snapshot_dir": snapdir, "model_file": model, "slots": SLOTS,
            "flash_attn": "on", "pod_name": name, "model_name": MODEL,
            "peer_networks": list(LOOPBACK_NETWORKS),  # the bed's agents are on loopback
        }
        llama = LlamaClient(server.url, self.http)
        app = create_app(AgentSettings(**{**values, **overrides}), llama=llama, http=self.http,
                         registry=CollectorRegistry(), token=TOKEN)
        stack = contextlib.AsyncExitStack()
        url = await stack.enter_async_context(serve_over_socket(app))
        stack.callback(server.stop)
        pod = BedPod(WarmPod(name, f"{name}@1", server.url, url), server, llama,
                     AgentClient(url, self.http, TOKEN), snapdir, stack)
        self.pods.append(pod)
        return pod

    async def stop(self, pod: BedPod) -> None:
        await pod.stack.aclose()
        self.pods.remove(pod)

    async def close(self) -> None:
        for pod in list(self.pods):
            await self.stop(pod)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=120.0) as client:
        yield client


@pytest.fixture
async def bed(start_llama_server: Any, tmp_path: Path, http: httpx.AsyncClient) -> AsyncIterator[Bed]:
    b = Bed(start_llama_server, tmp_path, http)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def index(redis_url: str) -> AsyncIterator[RedisPrefixIndex]:
    client = connect_index(redis_url, timeout_s=5.0)
    try:
        yield RedisPrefixIndex(client, prefix=f"warm{uuid.uuid4().hex[:8]}", op_timeout_s=5.0)
    finally:
        await client.aclose()


async def prefix_text(pod: BedPod) -> str:
    return render_prefix(SOURCE, ChatTemplate.from_props(await pod.llama.props()))


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
async def test_prefix_is_warm_and_reused_on_every_slot_of_every_pod_when_warmed(
    bed: Bed, index: RedisPrefixIndex, http: httpx.AsyncClient, tiny_models: Any, kind: str
) -> None:
    """Warm on two pods: both warm; the snapshot restores into any slot of either pod and a full agent
    request then reuses >= 95% of the prefix; the index holds it for both pods with its exact text
    identity; a second warm computes nothing; a pod started later is warmed from a peer (the first
    peer tried being dead); remove leaves no file and no index entry."""
    model: Path = getattr(tiny_models, kind)
    a, b = await bed.start(model, "pod-a"), await bed.start(model, "pod-b")
    seen: list[tuple[str, str]] = []

    def progress(state: PodWarmState) -> None:
        seen.append((state.pod, state.state))

    result = await warm_shared_prefix(SOURCE, [a.warm, b.warm], http=http, agent_token=TOKEN, index=index,
                                      progress=progress)
    assert [(p.pod, p.state) for p in result.pods] == [("pod-a", "warm"), ("pod-b", "warm")], result.pods
    text = await prefix_text(a)
    tokens = await a.llama.tokenize(text)
    assert result.tokens == len(tokens) > 4000
    assert result.n_chars == len(text) and result.bytes > 0 and result.warm == result.desired == 2
    assert all(p.tokens == len(tokens) and p.bytes == result.bytes for p in result.pods)
    assert seen[:2] == [("pod-a", "pending"), ("pod-b", "pending")]
    assert ("pod-a", "warm") in seen and seen[-1] == ("pod-b", "warm")

    # The index: both pods' snapshots, with the exact text identity; a full request's lookup finds them.
    snaps = await index.snapshots(MODEL)
    assert sorted(s.pod_uid for s in snaps) == ["pod-a@1", "pod-b@1"]
    assert {(s.name, s.n_chars, s.text_hash, s.n_tokens) for s in snaps} == {
        (result.snapshot, len(text), result.text_hash, len(tokens))}
    request = PROFILE.request(MODEL, "Please show the diff.")
    identity = chat_identity(request, ChatTemplate.from_props(await a.llama.props()), model=MODEL)
    lookup = await index.lookup(MODEL, identity.blocks)
    assert {s.pod_uid for s in lookup.snapshots} == {"pod-a@1", "pod-b@1"}
    assert all(s.extended_by(identity.text) for s in lookup.snapshots)
    assert max(lookup.slots.values()) == len(text) // 256  # the seed's slot holds the prefix too

    # Every slot of every pod: restore, then a full request pinned there reuses the prefix.
    for pod in (a, b):
        for slot in range(SLOTS):
            restored = await pod.agent.restore(result.snapshot, slot)
            assert restored.n_tokens == len(tokens)
            cache_n, prompt = await pod.chat_cache_n(slot, f"Please explain slot {slot} of {pod.warm.name}.")
            assert cache_n >= 0.95 * len(tokens), (pod.warm.name, slot, cache_n, prompt)

    # Twice: a no-op that refreshes the index (nothing saved or pulled again).
    before = {p.warm.name: (await p.agent.get(result.snapshot)).created_at for p in (a, b)}
    again = await warm_shared_prefix(SOURCE, [a.warm, b.warm], http=http, agent_token=TOKEN, index=index)
    assert again.snapshot == result.snapshot and again.tokens == result.tokens
    assert [(p.state, p.message) for p in again.pods] == [("warm", "already warm")] * 2
    assert {p.warm.name: (await p.agent.get(result.snapshot)).created_at for p in (a, b)} == before

    # A pod started later (b stopped first, to stay within two servers): pulled from a live peer.
    await bed.stop(b)
    c = await bed.start(model, "pod-c", await_required=True)
    first = await c.agent.readiness()
    assert not first["ready"] and first["declared"] is False  # not routable before its warmer spoke
    assert await declare_required([c.warm], [result.snapshot], http=http, agent_token=TOKEN) == {}
    assert list(await declare_required([b.warm], [], http=http, agent_token=TOKEN)) == ["pod-b"]
    assert (await c.agent.readiness())["missing"] == [result.snapshot]
    state = await warm_pod(result, SOURCE, c.warm, peers=[b.warm, a.warm, c.warm], http=http,
                           agent_token=TOKEN, index=index)
    assert (state.state, state.tokens, state.bytes) == ("warm", len(tokens), result.bytes), state
    assert state.message == "pulled from pod-a"
    assert (await c.agent.get(result.snapshot)).pinned  # evicted last on a later pod too
    assert "pod-c@1" in {s.pod_uid for s in await index.snapshots(MODEL)}
    assert await c.agent.ready()
    await c.agent.restore(result.snapshot, 1)
    cache_n, _ = await c.chat_cache_n(1, "Please run the tests.")
    assert cache_n >= 0.95 * len(tokens)

    # Remove: no file on any live pod, no index entry for any pod; the dead pod is named as not cleaned.
    with pytest.raises(WarmError, match="pod-b"):
        await remove_shared_prefix(result, [a.warm, b.warm, c.warm], http=http, agent_token=TOKEN,
                                   index=index)
    assert await a.agent.list() == [] and await c.agent.list() == []
    assert not [f for d in (a.dir, c.dir) for f in d.iterdir() if f.name.startswith("sp-")]
    assert await index.snapshots(MODEL) == []


async def test_refusing_pod_is_failed_with_the_agents_reason_and_the_other_stays_warm(
    bed: Bed, index: RedisPrefixIndex, http: httpx.AsyncClient, tiny_models: Any
) -> None:
    """A pod whose agent runs other KV settings refuses the snapshot: it is failed with the agent's
    reason and has no index entry; the seed pod is warm and indexed."""
    a = await bed.start(tiny_models.dense, "pod-a")
    b = await bed.start(tiny_models.dense, "pod-b", cache_type_k="q8_0")
    result = await warm_shared_prefix(SOURCE, [a.warm, b.warm], http=http, agent_token=TOKEN, index=index)
    good, bad = result.pods
    assert good.state == "warm" and bad.state == "failed"
    assert "fingerprint" in bad.message and "cache_type_k" in bad.message, bad.message
    assert result.warm == 1 and result.desired == 2
    assert [s.pod_uid for s in await index.snapshots(MODEL)] == ["pod-a@1"]
    assert await b.agent.list() == []

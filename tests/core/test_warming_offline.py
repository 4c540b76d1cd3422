"""Warming degrades per pod when pods cannot be reached: every pod is reported, nothing raises."""

from __future__ import annotations

import httpx

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.warming import (
    PrefixSource,
    WarmPod,
    WarmResult,
    remove_shared_prefix,
    warm_pod,
    warm_shared_prefix,
)
from llamafleet_local.redis_server import free_port


def dead_pod(name: str) -> WarmPod:
    """A pod whose ports nobody listens on (connection refused at once)."""
    return WarmPod(name, f"{name}@1", f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")


async def test_every_pod_fails_with_a_reason_when_no_pod_answers() -> None:
    source = PrefixSource(name="p", model="m", messages=({"role": "system", "content": "Be brief."},))
    async with httpx.AsyncClient(timeout=5.0) as http:
        result = await warm_shared_prefix(source, [dead_pod("a"), dead_pod("b")], http=http,
                                          agent_token="t", index=InMemoryPrefixIndex())
    assert result.snapshot == "" and result.warm == 0 and result.desired == 2
    assert all(p.state == "failed" and "/props" in p.message for p in result.pods)


async def test_raw_text_is_hashed_but_no_snapshot_named_when_their_agents_are_down() -> None:
    """Seeded nowhere: no snapshot name, so nobody records or requires it (issue 22, finding 1)."""
    source = PrefixSource(name="p", model="m", text="You are terse. " * 40)
    seen: list[str] = []
    async with httpx.AsyncClient(timeout=5.0) as http:
        result = await warm_shared_prefix(source, [dead_pod("a")], http=http, agent_token="t", index=None,
                                          progress=lambda s: seen.append(s.state))
    assert result.snapshot == "" and result.text_hash and result.n_chars == len(source.text or "")
    assert result.pods[0].state == "failed" and "agent not answering" in result.pods[0].message
    assert seen == ["pending", "failed"]


async def test_warm_pod_fails_without_a_warm_snapshot_or_a_reachable_agent() -> None:
    source = PrefixSource(name="p", model="m", text="x" * 300)
    empty = WarmResult("", 0, "", 0, 0, [])
    named = WarmResult("sp-p-0123456789ab", 10, "0123456789ab" * 2, 100, 300, [])
    async with httpx.AsyncClient(timeout=5.0) as http:
        nothing = await warm_pod(empty, source, dead_pod("c"), peers=[], http=http, agent_token="t",
                                 index=None)
        down = await warm_pod(named, source, dead_pod("c"), peers=[dead_pod("a")], http=http,
                              agent_token="t", index=None)
        await remove_shared_prefix("", [dead_pod("a")], http=http, agent_token="t", index=None)
    assert nothing.state == "failed" and "not warm on any pod" in nothing.message
    assert down.state == "failed" and "agent not answering" in down.message

"""Readiness gate: a pod is not ready until it holds, in usable form, every snapshot it was told to
require (`PUT /v1/required`), and with `await_required` not before it was told anything at all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llamafleet_agent import create_app
from llamafleet_core.agent_client import AgentClient, AgentError
from tests.agent.conftest import TOKEN, MakePod, Pod, prefill_prefix

pytestmark = pytest.mark.llama


async def readiness(pod: Pod) -> tuple[int, dict[str, Any]]:
    """/ready once the model digest is done (it starts on the first probe), as (status, body)."""
    for _ in range(200):
        resp = await pod.raw.get("/ready")  # public: no token
        body = resp.json()
        if body["model_digest"] and body["llama"]:
            return resp.status_code, body
        await asyncio.sleep(0.05)
    raise AssertionError(f"the agent never finished its model digest: {body}")


async def save(pod: Pod, name: str, slot: int = 0) -> None:
    tokens = await prefill_prefix(pod, slot)
    await pod.agent.save(slot, name, tokens=tokens)


async def test_pod_is_unready_until_requirements_are_declared_when_it_awaits_them(
    make_pod: MakePod, tiny_models: Any
) -> None:
    async with make_pod(tiny_models.dense, await_required=True) as pod:
        status, body = await readiness(pod)
        assert status == 503 and body["declared"] is False
        declared = await pod.agent.set_required([])
        assert declared.declared and declared.satisfied
        status, body = await readiness(pod)
        assert status == 200 and body["ready"] is True


async def test_ready_names_missing_snapshots_until_they_are_held_when_required(
    make_pod: MakePod, tiny_models: Any
) -> None:
    """Declared before the snapshot exists: 503 naming it; saved: 200; deleted: 503 again."""
    async with make_pod(tiny_models.dense) as pod:
        assert (await readiness(pod))[0] == 200  # nothing required, not awaiting: ready
        status = await pod.agent.set_required(["sp-agent-0123456789ab", "sp-agent-0123456789ab"])
        assert status.required == ["sp-agent-0123456789ab"] and not status.satisfied
        code, body = await readiness(pod)
        assert code == 503 and body["missing"] == ["sp-agent-0123456789ab"]
        assert (await AgentClient("http://agent", pod.raw, TOKEN).readiness())["ready"] is False

        await save(pod, "sp-agent-0123456789ab")
        code, body = await readiness(pod)
        assert code == 200 and body["missing"] == [] and body["required"] == ["sp-agent-0123456789ab"]
        assert await pod.agent.ready()

        await pod.agent.delete("sp-agent-0123456789ab")
        code, body = await readiness(pod)
        assert code == 503 and body["missing"] == ["sp-agent-0123456789ab"]


async def test_a_snapshot_that_does_not_fit_or_is_truncated_counts_as_missing(
    make_pod: MakePod, tiny_models: Any
) -> None:
    """Present by name is not enough: a foreign fingerprint or a wrong file size keeps the pod unready."""
    async with make_pod(tiny_models.dense) as pod:
        await save(pod, "foreign", slot=0)
        await save(pod, "short", slot=1)
        await pod.agent.set_required(["foreign", "short"])
        assert (await readiness(pod))[1]["missing"] == []

        manifest = json.loads((pod.dir / "foreign.json").read_text())
        manifest["fingerprint"]["cache_type_k"] = "q8_0"
        (pod.dir / "foreign.json").write_text(json.dumps(manifest))
        data = (pod.dir / "short.bin").read_bytes()
        (pod.dir / "short.bin").write_bytes(data[: len(data) // 2])
        code, body = await readiness(pod)
        assert code == 503 and body["missing"] == ["foreign", "short"]


async def test_requirements_survive_an_agent_restart_on_the_same_folder(
    make_pod: MakePod, tiny_models: Any, http: Any
) -> None:
    async with make_pod(tiny_models.dense, await_required=True) as pod:
        await pod.agent.set_required(["sp-a-0123456789ab"])
        again = create_app(pod.settings, llama=pod.llama, http=http, registry=CollectorRegistry(),
                           token=TOKEN)
        transport = httpx.ASGITransport(app=again)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as raw:
            status = await AgentClient("http://agent", raw, TOKEN).required()
        assert status.declared and status.required == ["sp-a-0123456789ab"]
        assert status.missing == ["sp-a-0123456789ab"] and not status.satisfied


async def test_required_list_is_refused_when_names_are_invalid_or_token_is_missing(
    make_pod: MakePod, tiny_models: Any
) -> None:
    async with make_pod(tiny_models.dense) as pod:
        for bad in (["../etc/passwd"], [".hidden"], ["a/b"], ["x" * 200]):
            with pytest.raises(AgentError) as err:
                await pod.agent.set_required(bad)
            assert err.value.status == 400, bad
        resp = await pod.raw.put("/v1/required", json={"snapshots": []})
        assert resp.status_code == 401
        assert (await pod.agent.required()).declared is False


async def test_required_snapshots_are_not_evicted_when_the_budget_is_exceeded(
    make_pod: MakePod, tiny_models: Any
) -> None:
    """Eviction would turn the pod unready: a required snapshot is kept even when it is the LRU one."""
    async with make_pod(tiny_models.dense) as probe:
        await save(probe, "size-probe")
        size = (await probe.agent.get("size-probe")).size
    async with make_pod(tiny_models.dense, budget_bytes=size + size // 2) as pod:
        await save(pod, "required-one")
        await save(pod, "unrequired-one")  # control: the budget holds one snapshot, so this evicted the first
        assert [m.name for m in await pod.agent.list()] == ["unrequired-one"]
        await save(pod, "required-one")
        await pod.agent.set_required(["required-one"])
        await save(pod, "newest")
        assert [m.name for m in await pod.agent.list()] == ["newest", "required-one"]
        assert (await readiness(pod))[0] == 200

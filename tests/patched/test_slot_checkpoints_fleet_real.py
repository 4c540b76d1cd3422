"""Gemma 3 through the gateway on patched pods with --slot-save-checkpoints: the agent's probe passes,
so the gateway builds the head's snapshot on first sight and restores it into an emptied slot, which
the server resumes (on upstream pods it would compute the whole prompt: test_real_model_real.py), with
the greedy answer of a cold run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest

from llamafleet_testbed.real_models import ensure_real_model
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.fixtures.llama import StartLlamaServer
from tests.integration.gateway_bed import chat, gateway, settled
from tests.integration.snapshot_bed import TOKEN, agent_pod
from tests.integration.test_snapshots_real import _fresh_slots, _tokens

pytestmark = [pytest.mark.llama, pytest.mark.models, pytest.mark.redis]


async def test_a_sliding_window_head_is_restored_and_resumed_on_patched_pods(
    start_patched_server: StartLlamaServer, tmp_path: Path, redis_url: str,
) -> None:
    gemma = ensure_real_model("gemma3-270m")
    profile = make_profile(WorkloadSpec(prefix_chars=4_000, tools_share=0.0, day=dt.date(2026, 11, 2),
                                        workspace="/srv/w"))
    body = {**profile.request("gemma", "Which file comes first?", max_tokens=8, stream=False),
            "logprobs": True}
    body.pop("tools")
    async with httpx.AsyncClient(timeout=300) as http, \
            agent_pod(start_patched_server, gemma, "gemma", tmp_path / "a", http, slots=2, ctx=2 * 4096,
                      flags=("--slot-save-checkpoints", "2")) as pod:
        cold = await http.post(pod.server.url + "/v1/chat/completions", json={**body, "cache_prompt": False})
        assert cold.status_code == 200, cold.text[:300]
        async with gateway([pod.spec], redis_url, prefix="rm-gemma-p", agent_token=TOKEN) as gw:
            [status] = await gw.app.state.gateway.discovery.endpoints()
            assert status.endpoint.restores is True, "the probe passed"
            first = await chat(http, gw.url, body)
            assert first.action == "compute/first_sight", first.action
            await _fresh_slots(pod, gw, "gemma", http)
            restored = await chat(http, gw.url, body)
            await settled(gw)
    assert restored.action.startswith("restore/"), restored.action
    assert restored.cache_n > 0.9 * restored.prompt_tokens, restored
    assert _tokens(restored.raw) == _tokens(cold.content), "a resumed restore changed the answer"

"""A pod that goes away mid-answer, through the real gateway and its aiohttp upstream leg: the client
gets a clean end (a retry on another pod when nothing was relayed yet), and the slot is given back."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.integration.gateway_bed import chat
from tests.router.orchestration.bed import assert_idle, fake_pods, gateway_over
from tests.router.orchestration.pods import ANSWER, Cuts

pytestmark = [pytest.mark.redis]

MODEL = "tiny"


def short_chat(question: str) -> dict[str, Any]:
    """A short conversation (below first sight's threshold): only the proxy's leg is exercised."""
    return {"model": MODEL, "stream": True, "max_tokens": 8,
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": question}]}


def events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[6:].strip()
            out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


async def test_a_pod_gone_mid_stream_ends_the_answer_with_an_error_and_frees_the_slot(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(1) as pods, gateway_over(pods, redis_url, prefix="orch-mid") as gw:
        pod = pods[0]
        pod.llama.cuts = Cuts(after=1)
        cut = await chat(http, gw.url, short_chat("hello?"))
        got = events(cut.raw)
        assert cut.status == 200 and got, cut.raw
        assert got[0]["choices"][0]["delta"]["content"] == ANSWER[0]  # relayed before the pod went
        assert "[DONE]" not in got, got  # no false end of stream
        assert "error" in got[-1], got[-1]  # the gateway says why it ended
        await assert_idle(gw, pods)

        again = await chat(http, gw.url, short_chat("hello again?"))
        assert again.status == 200 and events(again.raw)[-1] == "[DONE]", again.raw
        await assert_idle(gw, pods)


async def test_a_pod_gone_before_its_first_byte_is_retried_on_another_pod(
    redis_url: str, http: httpx.AsyncClient,
) -> None:
    async with fake_pods(2) as pods, gateway_over(pods, redis_url, prefix="orch-first") as gw:
        cuts = Cuts(after=0)  # whichever pod gets the request first drops it
        for pod in pods:
            pod.llama.cuts = cuts
        answer = await chat(http, gw.url, short_chat("hello?"))
        tried = [p.url for p in pods if p.llama.calls_to("/v1/chat/completions")]
        assert answer.status == 200 and events(answer.raw)[-1] == "[DONE]", answer.raw
        assert sorted(tried) == sorted(p.url for p in pods), tried  # both pods saw it
        assert cuts.left == 0
        await assert_idle(gw, pods)

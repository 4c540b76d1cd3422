"""Streaming through the gateway against a real llama-server: bytes pass untouched, and a client that
goes away mid-stream frees its slot (in-flight count, local and Redis lease, the server's own slot)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from llamafleet_core.types import SlotRef
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.integration.gateway_bed import chat, gateway

pytestmark = [pytest.mark.llama, pytest.mark.redis]


class RecordingTransport(httpx.AsyncBaseTransport):
    """The gateway's upstream transport, keeping a copy of every completion body as it came."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[bytearray] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/completions"):
            record = bytearray()
            self.bodies.append(record)
            response.stream = _Tee(response.stream, record)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, record: bytearray) -> None:
        self.inner, self.record = inner, record

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.record.extend(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def _body(stream: bool, max_tokens: int) -> dict[str, object]:
    return {"model": "tiny-dense", "stream": stream, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "You answer briefly. " * 40},
                         {"role": "user", "content": "Say something about slots."}]}


async def test_stream_reaches_the_client_byte_for_byte_when_proxied(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pod = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", "tiny-dense"))
    recorder = RecordingTransport()
    async with (
        httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(30.0, read=None)) as upstream,
        gateway([pod.url], redis_url, prefix="s1", http=upstream) as gw,
        httpx.AsyncClient(timeout=120) as http,
    ):
        answer = await chat(http, gw.url, _body(stream=True, max_tokens=24))
    assert answer.status == 200 and answer.raw.endswith(b"data: [DONE]\n\n")
    assert answer.raw.count(b"data: ") > 5  # really a stream of chunks
    assert len(recorder.bodies) == 1 and answer.raw == bytes(recorder.bodies[0])


async def test_slot_is_freed_everywhere_when_the_client_disconnects_mid_stream(
    tiny_models: TinyModels, start_llama_server: StartLlamaServer, redis_url: str
) -> None:
    pod = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", "tiny-dense"))
    async with gateway([pod.url], redis_url, prefix="s2") as gw, httpx.AsyncClient(timeout=120) as http:
        request = http.build_request("POST", gw.url + "/v1/chat/completions",
                                     json=_body(stream=True, max_tokens=4000))
        response = await http.send(request, stream=True)
        slot = SlotRef(pod.url, int(response.headers["x-llamafleet-slot"]))
        chunks = response.aiter_raw()
        await chunks.__anext__()  # the stream has started: the slot is generating
        state = gw.app.state.gateway
        assert state.in_flight.total() == 1 and await gw.leases.holder(slot) is not None
        await response.aclose()  # the client goes away

        for _ in range(100):
            slots = (await http.get(pod.url + "/slots")).json()
            freed = (
                state.in_flight.total() == 0
                and state.leases.held() == 0
                and await gw.leases.holder(slot) is None
                and not slots[slot.slot]["is_processing"]
            )
            if freed:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"slot not freed: in_flight={state.in_flight.total()} held={state.leases.held()} "
                        f"redis={await gw.leases.holder(slot)} server={slots[slot.slot]['is_processing']}")

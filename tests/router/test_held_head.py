"""A response's head goes out in one write with its first body bytes (`held_head.py`).

Served by uvicorn with the gateway's own protocol (`transport.bounded_protocol`); the writes are counted
on the connection's transport, below the protocol, so what is counted is what reaches the socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llamafleet_router.held_head import HeldHead
from llamafleet_router.inprocess import serve
from llamafleet_router.transport import HeadBounds, bounded_protocol
from tests.fuzz.fake_pod import fake_pod
from tests.fuzz.served import AUTH, app_for, gateway_settings

CHAT = {"model": "fake", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class CountingTransport:
    """The connection's transport, recording each write."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport, self.writes = transport, writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def counting_protocol(writes: list[bytes]) -> type[asyncio.Protocol]:
    base: Any = bounded_protocol(HeadBounds())

    class Counting(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(CountingTransport(transport, writes))

    return Counting


async def test_buffered_answer_goes_out_in_one_write() -> None:
    async def answer(request: Request) -> Response:
        return JSONResponse({"ok": True})

    writes: list[bytes] = []
    app = Starlette(routes=[Route("/json", answer)])
    async with serve(app, http=counting_protocol(writes)) as url, httpx.AsyncClient() as client:
        writes.clear()  # the startup probe's
        assert (await client.get(f"{url}/json")).json() == {"ok": True}
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b'{"ok":true}')


async def test_head_goes_alone_once_the_app_waits_before_its_first_chunk() -> None:
    """A stream whose first event is not ready: the client gets the head while the app still waits
    (it would hang here if the head were held until the first chunk), then the event in a write of
    its own."""
    release = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        await release.wait()
        yield b"data: 1\n\n"

    async def late(request: Request) -> Response:
        return StreamingResponse(events(), media_type="text/event-stream")

    writes: list[bytes] = []
    app = Starlette(routes=[Route("/late", late)])
    async with serve(app, http=counting_protocol(writes)) as url, httpx.AsyncClient() as client:
        writes.clear()
        async with asyncio.timeout(10), client.stream("GET", f"{url}/late") as response:
            assert response.status_code == 200
            assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
            release.set()
            assert await response.aread() == b"data: 1\n\n"
    assert writes[1].startswith(b"9\r\ndata: 1\n\n")


async def test_relayed_stream_sends_its_head_with_the_first_event() -> None:
    """Through the gateway: the pod's stream is relayed, and the client's first bytes on the wire are
    the head and the first event together."""
    writes: list[bytes] = []
    async with serve(fake_pod([])) as pod_url:
        app = app_for(gateway_settings(pod_url))
        async with serve(app, http=counting_protocol(writes)) as url, httpx.AsyncClient() as client:
            writes.clear()
            async with client.stream("POST", f"{url}/v1/chat/completions", json=CHAT,
                                     headers=AUTH) as response:
                assert response.status_code == 200
                body = await response.aread()
    assert b"data: " in body
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\n\r\n" in writes[0]
    assert b"data: " in writes[0].split(b"\r\n\r\n", 1)[1]


class Recorded:
    """A transport for HeldHead alone: its writes, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


async def test_held_head_joins_the_next_write_of_the_same_step_and_no_later_one() -> None:
    recorded = Recorded()
    held = HeldHead(recorded, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"head")
    held.write(b"body")
    held.write(b"more")
    assert recorded.writes == [b"headbody", b"more"]
    held.flush()  # as the flush scheduled for the end of the step: nothing is held any more
    assert recorded.writes == [b"headbody", b"more"]
    assert held.get_extra_info("peername") == "extra:peername"


async def test_held_head_goes_out_before_a_close_and_never_after_one() -> None:
    recorded = Recorded()
    held = HeldHead(recorded, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"head")
    held.close()
    assert recorded.writes == [b"head"] and held.is_closing()
    other = Recorded()
    late = HeldHead(other, asyncio.get_running_loop())  # type: ignore[arg-type]
    late.write(b"head")
    other.closed = True  # the connection went away before the step ended
    late.flush()
    assert other.writes == []

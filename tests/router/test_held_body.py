"""What a request keeps while its pod computes the prompt, through the gateway's own upstream client
(aiohttp, which holds the answer back until the pod's first generated text) and a raw HTTP pod."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_router.app import create_app
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.inprocess import serve
from llamafleet_router.proxy.forward import ROUTER_FIELDS, encoded_body, pinned_body
from llamafleet_router.settings import RouterSettings
from tests.router.conftest import chat_body
from tests.router.fakes import FakePod


class ComputingPod:
    """A llama-server that answers its probes and, to a completion, sends its 200 and the role-only
    event and then computes the prompt until `done` (and goes away without generating anything)."""

    def __init__(self) -> None:
        self.fake = FakePod("http://unused")
        self.computing = asyncio.Event()
        self.done = asyncio.Event()
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                if method == "POST":
                    self.bodies.append(json.loads(body))
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")
                    event = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\r\n\r\n'
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    self.computing.set()
                    await self.done.wait()
                    return
                answer = {"/health": {"status": "ok"}, "/props": self.fake.props(),
                          "/slots": self.fake.slots()}.get(path, {})
                data = json.dumps(answer).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(data), data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def gateway_before(pod: ComputingPod) -> AsyncIterator[str]:
    server = await asyncio.start_server(pod.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    settings = RouterSettings(pods=[url], poll_interval=30.0)
    app = create_app(settings, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(),
                     discovery=lambda client, fence: StaticDiscovery([PodSpec.parse(url)], client,
                                                                     poll_interval=30.0, fence=fence),
                     registry=CollectorRegistry())
    try:
        async with serve(app) as base:
            yield base
    finally:
        server.close()


async def test_the_parsed_body_is_not_held_while_the_pod_computes() -> None:
    """Until the pod's first generated text a request may be sent again elsewhere, so it keeps its
    body; it keeps it encoded, not as the parsed tree (2.3 times the bytes, and what the garbage
    collector walked at 64 streams). While the pod computes, no list of the client's messages is alive
    but the test's own and the pod's copy; the body the pod got is the client's, pinned to a slot."""
    pod = ComputingPod()
    marker = f"a question no other test asks {id(pod)}"
    body = chat_body(stream=True, id_slot=5, max_tokens=5)
    body["messages"][1] = {"role": "user", "content": marker}
    async with gateway_before(pod) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        sent = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await asyncio.wait_for(pod.computing.wait(), 10.0)
        received = pod.bodies[0]
        theirs = {id(received["messages"]), id(body["messages"])}
        # lists of messages: a dict of strings alone is not tracked by the collector, a list is
        held = [o for o in gc.get_objects() if type(o) is list and id(o) not in theirs and len(o) == 2
                and type(o[1]) is dict and o[1].get("content") == marker]
        pod.done.set()
        # gone before answering: the request is scheduled again, from the kept bytes, and no pod is left
        assert (await sent).status_code == 503
    assert held == []
    assert received == {**body, "id_slot": received["id_slot"], "cache_prompt": True}
    assert received["id_slot"] in range(pod.fake.n_slots)  # 2 slots: the client's 5 was overridden


def test_an_encoded_body_pinned_to_a_slot_is_the_body_with_the_routers_fields() -> None:
    """Each attempt pins the bytes encoded once: the client's fields in their order, its own `id_slot`
    and `cache_prompt` dropped, the router's at the end; an integer past 64 bits as the client wrote it."""
    bodies: list[dict[str, Any]] = [
        {}, {"id_slot": 3}, {"cache_prompt": False, "id_slot": 1},
        {"model": "m", "id_slot": 9, "messages": [{"role": "user", "content": "é \u2028 \"id_slot\":1}"}]},
        {"model": "m", "seed": 2**70, "stream": True},
    ]
    for body in bodies:
        own = {k: v for k, v in body.items() if k not in ROUTER_FIELDS}
        for slot in (0, 12):
            pinned = pinned_body(encoded_body(body), slot)
            expected = [*own.items(), ("id_slot", slot), ("cache_prompt", True)]
            assert list(json.loads(pinned).items()) == expected
    big = pinned_body(encoded_body({"seed": 2**70}), 1)
    assert big == b'{"seed":%d,"id_slot":1,"cache_prompt":true}' % 2**70

"""Every HTTP client the packages make drops an idle pooled connection before llama-server and uvicorn
close it (http_pool.py): else a request written into a connection the server is closing fails with
"Server disconnected without sending a response" (the seed table's harness met it in CI). When a server
drops one anyway, an idempotent request is sent once more on a new connection, and nothing else is."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llamafleet_core import http_pool
from llamafleet_router.app import make_http_client
from llamafleet_router.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "router", "agent", "operator", "local", "cli", "testbed")
# A client or pool built by hand would come with httpx's 5 s keep-alive, the servers' own idle time.
BY_HAND = re.compile(r"\bhttpx\.(AsyncClient|Client|Limits)\(")


def _expiry(client: httpx.AsyncClient | httpx.Client) -> float | None:
    return client._transport.inner._pool._keepalive_expiry  # type: ignore[attr-defined]


def test_the_pool_lets_a_connection_go_before_the_servers_close_it() -> None:
    assert http_pool.KEEPALIVE_EXPIRY_S < http_pool.SERVER_IDLE_S
    assert http_pool.pool_limits().keepalive_expiry == http_pool.KEEPALIVE_EXPIRY_S


async def test_clients_use_the_pool_unless_given_limits() -> None:
    async with http_pool.async_client(timeout=3.0) as client:
        assert _expiry(client) == http_pool.KEEPALIVE_EXPIRY_S
        assert client.timeout.read == 3.0
    with http_pool.sync_client() as sync:
        assert _expiry(sync) == http_pool.KEEPALIVE_EXPIRY_S
    async with http_pool.async_client(limits=http_pool.pool_limits(max_connections=2)) as small:
        assert small._transport.inner._pool._max_connections == 2  # type: ignore[attr-defined]


async def test_the_gateway_client_expires_connections_before_pods_and_agents_close_them() -> None:
    client = make_http_client(RouterSettings(max_connections=7))
    try:
        assert _expiry(client) == http_pool.KEEPALIVE_EXPIRY_S
        assert client._transport.inner._pool._max_connections == 7  # type: ignore[attr-defined]
        session = client.session()  # type: ignore[attr-defined]
        assert session.connector._keepalive_timeout == http_pool.KEEPALIVE_EXPIRY_S
    finally:
        await client.aclose()


async def test_the_clients_connect_directly_whatever_proxy_the_environment_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy the cluster injects into every pod must not carry the fleet's own traffic: nothing
    listens at the proxy's address here, so a request sent through it would fail."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    server = DropsKeptConnections()
    async with server as url, http_pool.async_client(base_url=url, timeout=5.0) as client:
        assert (await client.get("/health")).text == "ok"
        gateway = make_http_client(RouterSettings())
        try:
            assert (await gateway.get(f"{url}/health")).text == "ok"
        finally:
            await gateway.aclose()
    assert [method for _, method in server.requests] == ["GET", "GET"]


def test_no_package_builds_an_httpx_client_by_hand() -> None:
    sources = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if p.name != "http_pool.py"]
    by_hand = [f"{path.relative_to(ROOT)}:{n}" for path in sources
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if BY_HAND.search(line)]
    assert not by_hand, by_hand


class DropsKeptConnections:
    """An HTTP/1.1 server that answers the first request of each connection, keeps the connection
    open, and closes it without an answer when a second request arrives on it: what a server
    that closes a kept-alive connection as the client writes into it looks like from the client."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str]] = []  # (connection, method), in arrival order
        self._connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        connection = self._connections
        try:
            for answered in (True, False):
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append((connection, head.split(b" ", 1)[0].decode()))
                if not answered:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()


async def test_an_idempotent_request_is_sent_again_when_its_kept_connection_was_dropped() -> None:
    server = DropsKeptConnections()
    async with server as url, http_pool.async_client(base_url=url, timeout=5.0) as client:
        assert (await client.get("/metrics")).text == "ok"
        assert (await client.get("/slots")).text == "ok"
        assert (await client.put("/snapshot", content=b"bytes")).text == "ok"
    # The second GET went into the first connection, was dropped, and was answered on a new one;
    # the PUT, with its body in memory, likewise.
    assert server.requests == [(1, "GET"), (1, "GET"), (2, "GET"), (2, "PUT"), (3, "PUT")]


async def test_a_post_or_a_streamed_body_is_never_sent_twice() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"part"

    server = DropsKeptConnections()
    async with server as url, http_pool.async_client(base_url=url, timeout=5.0) as client:
        await client.get("/health")
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/completion", json={"prompt": "x"})
        await client.get("/health")
        # The server may close while the chunks are still being written: a reset, not a disconnect.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await client.put("/snapshot", content=chunks())
    assert server.requests == [(1, "GET"), (1, "POST"), (2, "GET"), (2, "PUT")]


async def test_the_blocking_client_sends_an_idempotent_request_again_too() -> None:
    def two_reads(url: str) -> list[str]:
        with http_pool.sync_client(base_url=url, timeout=5.0) as client:
            return [client.get("/metrics").text, client.get("/metrics").text]

    server = DropsKeptConnections()
    async with server as url:
        assert await asyncio.to_thread(two_reads, url) == ["ok", "ok"]
    assert server.requests == [(1, "GET"), (1, "GET"), (2, "GET")]

"""Every HTTP client the packages make drops an idle pooled connection before llama-server and uvicorn
close it (http_pool.py): else a request written into a connection the server is closing fails with
"Server disconnected without sending a response" (the seed table's harness met it in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from llamafleet_core import http_pool
from llamafleet_router.app import make_http_client
from llamafleet_router.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "router", "agent", "operator", "local", "cli", "testbed")
# A client or pool built by hand would come with httpx's 5 s keep-alive, the servers' own idle time.
BY_HAND = re.compile(r"\bhttpx\.(AsyncClient|Client|Limits)\(")


def _expiry(client: httpx.AsyncClient | httpx.Client) -> float | None:
    return client._transport._pool._keepalive_expiry  # type: ignore[attr-defined]


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
        assert small._transport._pool._max_connections == 2  # type: ignore[attr-defined]


async def test_the_gateway_client_expires_connections_before_pods_and_agents_close_them() -> None:
    client = make_http_client(RouterSettings(max_connections=7))
    try:
        assert _expiry(client) == http_pool.KEEPALIVE_EXPIRY_S
        assert client._transport._pool._max_connections == 7  # type: ignore[attr-defined]
        session = client.session()  # type: ignore[attr-defined]
        assert session.connector._keepalive_timeout == http_pool.KEEPALIVE_EXPIRY_S
    finally:
        await client.aclose()


def test_no_package_builds_an_httpx_client_by_hand() -> None:
    sources = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if p.name != "http_pool.py"]
    by_hand = [f"{path.relative_to(ROOT)}:{n}" for path in sources
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if BY_HAND.search(line)]
    assert not by_hand, by_hand

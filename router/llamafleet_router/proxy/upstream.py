"""The app's HTTP client: httpx for everything, plus an aiohttp session for the proxied requests.

The proxy's upstream leg is the gateway's hottest path. With httpx, the pool costs O(connections) per
request (httpcore walks every pooled connection, polling each socket, on every request and response
close), a large share of the gateway's CPU at many concurrent streams. aiohttp's pool is a per-host
deque and its HTTP parser is in C (docs/design.md, "Measurements behind the rules").

`GatewayClient` IS an `httpx.AsyncClient` (discovery's polls, the agent client and embedding code keep
using httpx, and tests can still inject a plain httpx client with a MockTransport, which the proxy then
uses), and carries the aiohttp session that `proxy.forward` prefers when it is given one.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx

from llamafleet_core import http_pool


class GatewayClient(httpx.AsyncClient):
    """An httpx client that also owns the aiohttp session of the proxy's upstream requests."""

    def __init__(self, *, connect_timeout: float, max_connections: int, **httpx_options: Any) -> None:
        super().__init__(**httpx_options)
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The upstream session, created on first use (aiohttp wants a running event loop for it)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, ttl_dns_cache=300, force_close=False,
                # llama-server closes idle keep-alive connections after 5 s: drop ours first, so a
                # request is not written into a connection the pod is closing (http_pool.py).
                keepalive_timeout=http_pool.KEEPALIVE_EXPIRY_S,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # No total or read timeout: a generation may stream for many minutes.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                # Relay the bytes as the pod sent them (we ask for identity anyway), like `aiter_raw`.
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await super().aclose()

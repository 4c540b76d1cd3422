"""The HTTP clients llamafleet's own code makes, with keep-alive connections it drops before the servers
it talks to close them.

llama-server (cpp-httplib: `CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND`) and uvicorn (the gateway, the agent:
`timeout_keep_alive`) close a connection that has been idle for 5 s, and httpx's pool keeps one for 5 s
by default. A request written into a pooled connection just as the server closes it fails with
"Server disconnected without sending a response", which httpx does not retry: a restore, a `/slots`
read or a health check fails for nothing, now and then (the seed table's harness met it in CI). The
pool here lets a connection go after `KEEPALIVE_EXPIRY_S`, so the client always gives it up first.

That covers the idle timer only: a server also closes a kept-alive connection when it stops or
restarts, when a worker thread's connection is dropped under load, or on a loaded machine where the
client's expiry check and the server's timer race (a full run met the error once more, on a `/metrics`
read). So the clients' transport also sends an idempotent request with a replayable body once more, on
a new connection, when the server dropped the one it was written into before answering: urllib3 and
aiohttp (the gateway's proxy session) do the same. A POST is never sent twice.

The clients connect directly, whatever proxy the environment names (httpx applies `HTTP_PROXY` and
the like only to a client on its default transport): every address they are given is the fleet's own
(pods, agents, gateways, the operator's targets), and a cluster that injects a proxy into every pod
must not route the gateway's traffic to its pods through it.

Every `httpx.AsyncClient` and `httpx.Client` of the packages comes from here (a test checks that), so
no new one brings the default back.
"""

from __future__ import annotations

from typing import Any

import httpx

# The idle time after which llama-server and uvicorn close a kept-alive connection.
SERVER_IDLE_S = 5.0
# Ours, a second under theirs: enough for a loaded machine's scheduling delay between the pool's check
# and the request's first byte.
KEEPALIVE_EXPIRY_S = 4.0

# httpx's own defaults for the pool's size.
_MAX_CONNECTIONS = 100
_MAX_KEEPALIVE = 20


def pool_limits(max_connections: int | None = _MAX_CONNECTIONS,
                max_keepalive: int | None = _MAX_KEEPALIVE) -> httpx.Limits:
    """httpx's pool limits with `KEEPALIVE_EXPIRY_S` (None: no bound on that count)."""
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive,
                        keepalive_expiry=KEEPALIVE_EXPIRY_S)


# RFC 9110 9.2.2: sending one of these twice has the effect of sending it once.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# What the client passes to its default transport; moved to ours when we build it.
_TRANSPORT_OPTIONS = ("verify", "cert", "http1", "http2", "limits")


def may_resend(request: httpx.Request) -> bool:
    """Whether `request` can be sent again after its connection dropped before any answer: an
    idempotent method, and a body held in memory (a streamed one is already spent)."""
    return request.method in IDEMPOTENT_METHODS and isinstance(request.stream, httpx.ByteStream)


class AsyncResendingTransport(httpx.AsyncBaseTransport):
    """`inner`, sending a request that `may_resend` once more when the server dropped its
    connection without answering (httpx's `RemoteProtocolError`; httpcore takes the dead
    connection out of the pool, so the second try opens a new one)."""

    def __init__(self, inner: httpx.AsyncHTTPTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.RemoteProtocolError:
            if not may_resend(request):
                raise
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ResendingTransport(httpx.BaseTransport):
    """`AsyncResendingTransport` for the blocking client."""

    def __init__(self, inner: httpx.HTTPTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return self.inner.handle_request(request)
        except httpx.RemoteProtocolError:
            if not may_resend(request):
                raise
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def async_transport(**options: Any) -> AsyncResendingTransport:
    """A resending `httpx.AsyncHTTPTransport(**options)`, on `pool_limits()` unless given `limits`."""
    options.setdefault("limits", pool_limits())
    return AsyncResendingTransport(httpx.AsyncHTTPTransport(**options))


def sync_transport(**options: Any) -> ResendingTransport:
    """`async_transport` for the blocking client."""
    options.setdefault("limits", pool_limits())
    return ResendingTransport(httpx.HTTPTransport(**options))


def _transport_options(options: dict[str, Any]) -> dict[str, Any]:
    """Take the transport's options out of a client's."""
    return {name: options.pop(name) for name in _TRANSPORT_OPTIONS if name in options}


def async_client(**options: Any) -> httpx.AsyncClient:
    """`httpx.AsyncClient(**options)` on `async_transport`; a `transport` given (a test's) is used as
    it is."""
    if "transport" not in options:
        options["transport"] = async_transport(**_transport_options(options))
    return httpx.AsyncClient(**options)


def sync_client(**options: Any) -> httpx.Client:
    """`async_client` for `httpx.Client`."""
    if "transport" not in options:
        options["transport"] = sync_transport(**_transport_options(options))
    return httpx.Client(**options)

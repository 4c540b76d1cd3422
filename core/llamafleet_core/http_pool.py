"""The HTTP clients llamafleet's own code makes, with keep-alive connections it drops before the servers
it talks to close them.

llama-server (cpp-httplib: `CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND`) and uvicorn (the gateway, the agent:
`timeout_keep_alive`) close a connection that has been idle for 5 s, and httpx's pool keeps one for 5 s
by default. A request written into a pooled connection just as the server closes it fails with
"Server disconnected without sending a response", which httpx does not retry: a restore, a `/slots`
read or a health check fails for nothing, now and then (the seed table's harness met it in CI). The
pool here lets a connection go after `KEEPALIVE_EXPIRY_S`, so the client always gives it up first.

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


def async_client(**options: Any) -> httpx.AsyncClient:
    """`httpx.AsyncClient(**options)` on `pool_limits()` unless `options` has `limits`."""
    options.setdefault("limits", pool_limits())
    return httpx.AsyncClient(**options)


def sync_client(**options: Any) -> httpx.Client:
    """`httpx.Client(**options)` on `pool_limits()` unless `options` has `limits`."""
    options.setdefault("limits", pool_limits())
    return httpx.Client(**options)

"""A pass-through HTTP proxy between the gateway and a real llama-server that records what it forwards.

It forwards each request as it came (method, target, headers but the hop-by-hop ones, body bytes) and
streams the answer back unchanged (status, headers, raw body bytes: SSE included), so the gateway sees
the real server; every request it forwarded is kept (`Forwarded`), with its body, so a test can say
what reached the server: which fields the gateway let through, on which path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

# Hop-by-hop headers (RFC 9110 section 7.6.1): they describe one connection, never the message.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                  "upgrade", "host"})


@dataclass(frozen=True)
class Forwarded:
    """One request the proxy forwarded to the server."""

    method: str
    path: str
    body: bytes

    def json_body(self) -> Any:
        """The body as JSON (None when it is empty or not JSON)."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


@dataclass
class RecordingProxy:
    """The proxy as an ASGI app, forwarding to `upstream` (a base URL)."""

    upstream: str
    forwarded: list[Forwarded] = field(default_factory=list)
    _http: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        target = (raw + (b"?" + query if query else b"")).decode("latin-1")
        self.forwarded.append(Forwarded(scope["method"], scope["path"], bytes(body)))
        headers = [(k, v) for k, v in scope["headers"]  # the length: httpx writes it for the same bytes
                   if k.decode("latin-1").lower() not in _HOP | {"content-length"}]
        if self._http is None:  # made on the serving loop, on first use
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(120.0))
        request = self._http.build_request(scope["method"], self.upstream.rstrip("/") + target,
                                           headers=headers, content=bytes(body))
        response = await self._http.send(request, stream=True)
        try:
            kept = [(k, v) for k, v in response.headers.raw if k.decode("latin-1").lower() not in _HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._http is not None:
                    await self._http.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

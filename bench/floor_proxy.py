"""(not a benchmark) The floor under any Python gateway: proxies that do nothing but pass requests on.

The overhead benchmark runs these beside the real gateway, so that its added latency can be read against
what Python itself costs on the same machine in the same run:

- `asgi`: the gateway's own stack with none of its work. uvicorn (uvloop, httptools), one bare ASGI
  callable, and an aiohttp session to the upstream: read the body, POST it, stream the answer back
  chunk by chunk. No parsing, no prompt identity, no decision, no metrics, no logs.
- `raw`: no HTTP framework at all. An asyncio protocol on uvloop splits the client's requests by
  `content-length`, sends each one as it is over a pooled upstream connection, and copies the
  upstream's bytes back unchanged until the chunked body's last chunk. It understands only what the
  benchmark sends (keep-alive POSTs with a length; chunked or length-framed answers), which is the
  point: it is the least a Python process can do per request.

    python bench/floor_proxy.py --mode asgi|raw --upstream http://127.0.0.1:PORT --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any
from urllib.parse import urlsplit

# ---- asgi: uvicorn + aiohttp, no work ----------------------------------------------------------------


def asgi_app(upstream: str) -> Any:
    import aiohttp

    state: dict[str, aiohttp.ClientSession] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["s"] = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await state["s"].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with state["s"].post(upstream + scope["path"], data=body,
                                   headers={"content-type": "application/json"}) as up:
            headers = [(b"content-type", up.headers.get("content-type", "").encode())]
            await send({"type": "http.response.start", "status": up.status, "headers": headers})
            async for chunk in up.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


# ---- raw: bytes in, bytes out ------------------------------------------------------------------------

_END = b"0\r\n\r\n"


def content_length(head: bytes) -> int:
    """The `content-length` of a lower-cased message head; -1 when it has none."""
    if b"content-length:" not in head:
        return -1
    return int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])


class Upstream(asyncio.Protocol):
    """One pooled upstream connection; copies every byte it receives to the current client."""

    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.head: bytes | None = b""  # the response head until it is complete
        self.remaining = -1  # bytes of a length-framed body still to come; -1 when chunked
        self.tail = b""  # the last bytes of a chunked body, to spot its end across reads

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None or client.transport is None:
            return
        client.transport.write(data)
        if self.head is not None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, body = self.head[:end].lower(), self.head[end + 4:]
            self.head = None
            self.remaining = content_length(head)
            data = body
        if self.remaining >= 0:
            self.remaining -= len(data)
            done = self.remaining <= 0
        else:
            self.tail = (self.tail + data)[-len(_END):]
            done = self.tail == _END
        if done:
            self.client, self.head, self.remaining, self.tail = None, b"", -1, b""
            self.pool.append(self)
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()


class Client(asyncio.Protocol):
    def __init__(self, host: str, port: int, pool: list[Upstream]) -> None:
        self.host, self.port, self.pool = host, port, pool
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.busy = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.next_request()

    def next_request(self) -> None:
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        length = max(0, content_length(head))
        if len(self.buffer) < end + 4 + length:
            return
        request, self.buffer = self.buffer[: end + 4 + length], self.buffer[end + 4 + length:]
        self.busy = True
        asyncio.get_running_loop().create_task(self.send(request))

    async def send(self, request: bytes) -> None:
        if self.pool:
            upstream = self.pool.pop()
        else:
            loop = asyncio.get_running_loop()
            _, upstream = await loop.create_connection(lambda: Upstream(self.pool), self.host, self.port)
        upstream.client = self
        assert upstream.transport is not None
        upstream.transport.write(request)

    def answered(self) -> None:
        self.busy = False
        self.next_request()


async def serve_raw(upstream: str, port: int) -> None:
    url = urlsplit(upstream)
    pool: list[Upstream] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(url.hostname or "127.0.0.1", url.port or 80, pool),
                                      "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["asgi", "raw"], required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    if args.mode == "asgi":
        import uvicorn

        uvicorn.run(asgi_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, loop="uvloop",
                    http="httptools", log_level="warning", access_log=False)
    else:
        import uvloop

        uvloop.run(serve_raw(args.upstream, args.port))


if __name__ == "__main__":
    main()

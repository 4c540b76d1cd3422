"""A stand-in for whatever an attacker puts at an address: a real HTTP server on a loopback port that
records every request it gets (method, path, Authorization) and answers what the test set up.

Used as a lying peer agent (a manifest it chose, a file shorter than claimed), as a collector a tampered
membership points at, and as a peer that answers an error with a body that must never be echoed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llamafleet_router.inprocess import serve


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    authorization: str


@dataclass
class Stub:
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    # path -> (status, body); anything else: 404
    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


@contextlib.asynccontextmanager
async def stub_server() -> AsyncIterator[Stub]:
    stub = Stub()

    async def anything(request: Request) -> Response:
        stub.seen.append(Seen(request.method, request.url.path, request.headers.get("authorization", "")))
        status, body = stub.answers.get(request.url.path, (404, b'{"error": "no such thing"}'))
        return Response(body, status_code=status, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST", "PUT", "DELETE"])])
    async with serve(app, shutdown_timeout=5.0) as url:
        stub.url = url
        yield stub

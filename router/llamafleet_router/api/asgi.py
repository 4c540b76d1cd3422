"""The gateway's ASGI app: the inference routes taken before Starlette's middleware stack, and each
request's ids (the gateway's own, and the client's `x-request-id` echoed back) set for the logs."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llamafleet_router.api.info import http_error, server_error
from llamafleet_router.api.parse import Route as ParseRoute
from llamafleet_router.logs import client_request_id_var, request_id_var


def client_request_id(scope: Scope) -> str | None:
    """The client's `x-request-id` when sane (printable, at most 128 characters), else None."""
    given = b""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            given = value
            break
    rid = given.decode("latin-1").strip()
    return rid if 0 < len(rid) <= 128 and rid.isprintable() else None


@contextlib.contextmanager
def request_ids(scope: Scope) -> Iterator[str]:
    """Set this request's ids for the logs and the request path; yields the id to echo back.

    The gateway's id is fresh for every request: a client's id is its own business (a retry or a session
    may send one id many times), and a lease or a flight keyed by it would be another request's too."""
    client = client_request_id(scope)
    own = uuid.uuid4().hex
    token, client_token = request_id_var.set(own), client_request_id_var.set(client)
    try:
        yield client or own
    finally:
        request_id_var.reset(token)
        client_request_id_var.reset(client_token)


class RequestIdMiddleware:
    """The request's ids (`request_ids`) set for logs; the client's (or the gateway's) echoed on every
    response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with request_ids(scope) as rid:

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    MutableHeaders(scope=message)["x-request-id"] = rid
                await send(message)

            await self.app(scope, receive, send_with_id)


InferenceHandler = Callable[[Request, ParseRoute], Awaitable[Response]]


class GatewayApp(Starlette):
    """Starlette, with the inference routes (`api.parse.Route`, whose values are their paths) taken
    before its middleware stack.

    The stack (error middleware, request-id middleware, exception middleware, router, the endpoint
    wrapper) wrapped every SSE chunk's `send` in three more coroutines and cost each request a twentieth
    of the gateway's CPU. The inference routes need none of it: they answer their own errors (a method
    other than POST gets the 405 Starlette's router gave), and the request id goes on the response
    itself. Every other path, and the lifespan, go through Starlette as before."""

    def __init__(self, *args: Any, handler: InferenceHandler, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inference = {route.value: route for route in ParseRoute}
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._inference.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        with request_ids(scope) as rid:
            request = Request(scope, receive)
            try:
                if scope["method"] == "POST":
                    response = await self._handler(request, route)
                else:
                    response = await http_error(request, HTTPException(405, headers={"Allow": "POST"}))
            except Exception as exc:  # what Starlette's error middleware did: a 500 in OpenAI's shape
                response = await server_error(request, exc)
            response.headers["x-request-id"] = rid
            await response(scope, receive, send)

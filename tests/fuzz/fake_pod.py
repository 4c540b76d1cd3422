"""A fake llama-server for fuzzing the gateway: answers like the real one (health, props, slots, chat
and text completions, JSON or SSE; a token count, one embedding) in microseconds, so that thousands of
generated requests cost seconds.

What is fuzzed is the gateway's own parsing, auth, scheduling and proxying; what llama-server does with
a body is the real-server tests' business. The fake records the `id_slot` of every body it received, and
every request it was asked (`Hit`).

A streamed body with the fake-only field `fake_events: N` gets N events of 4 KB each, produced one at a
time as the server takes them, like a long generation; its progress is recorded (`Stream`), so that a
test can see backpressure stall it and a disconnect stop it.

A non-streamed body with the fake-only field `fake_bytes: N` gets an answer of about N bytes (one long
`content`), produced 64 KiB at a time as the server takes them, with a Content-Length when it also sets
`fake_declare: true`; its progress is recorded as a `Stream` whose events are the 64 KiB pieces, so that
a test can see how much of it the gateway read before it gave up.

Any route the real server has beyond the ones above (`POST /props`, `/slots/0`, `/tokenize`, ...) is
answered by a catch-all with 200: a request the gateway should never have forwarded then shows up as a
success, not as a 404/405 that a surface test would accept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL = "fake"
SLOTS = 2
TIMINGS = {"cache_n": 0, "prompt_n": 12, "predicted_n": 2, "prompt_ms": 1.0, "predicted_ms": 1.0}
#: Set by the test harness (served.py) on requests the gateway's HTTP client sends outside any client
#: request: discovery's polls. The gateway never forwards a client's headers, so a client cannot forge it.
BACKGROUND = "x-fake-pod-background"
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
#: The fake-only body fields (see above): the gateway forwards them only when told to (`extra_fields`).
FAKE_FIELDS = ("fake_events", "fake_bytes", "fake_declare")


@dataclass(frozen=True)
class Hit:
    """One request the pod was asked: method, raw target (path and query string, undecoded), and
    whether the gateway sent it on its own, outside a client request."""

    method: str
    target: str
    background: bool

    def __str__(self) -> str:
        return f"{'background ' if self.background else ''}{self.method} {self.target}"


@dataclass
class Stream:
    """One long stream (`fake_events`): events handed to the server so far, and whether it has ended
    (all sent, or stopped because the gateway closed the connection)."""

    total: int
    sent: int = 0
    ended: bool = False


_LONG_EVENT = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}],
                                      "object": "chat.completion.chunk"}, separators=(",", ":")).encode()
_LONG_EVENT += b"\n\n"
_PIECE = b"x" * (64 * 1024)


async def _large(stream: Stream, head: bytes, tail: bytes) -> AsyncIterator[bytes]:
    try:
        yield head
        for _ in range(stream.total):
            yield _PIECE
            stream.sent += 1
            await asyncio.sleep(0)  # as in _long: a closed connection is noticed between two pieces
        yield tail
    finally:
        stream.ended = True


def _large_answer(size: int, slot: object, declare: bool, streams: list[Stream]) -> Response:
    head = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"'
    tail = (b'"},"finish_reason":"stop"}],"timings":' + json.dumps(TIMINGS).encode()
            + b',"id_slot":' + json.dumps(slot).encode() + b',"object":"chat.completion"}')
    streams.append(stream := Stream(max(0, size - len(head) - len(tail)) // len(_PIECE)))
    length = len(head) + stream.total * len(_PIECE) + len(tail)
    headers = {"content-length": str(length)} if declare else None
    return StreamingResponse(_large(stream, head, tail), media_type="application/json", headers=headers)


async def _long(stream: Stream, tail: bytes) -> AsyncIterator[bytes]:
    try:
        for _ in range(stream.total):
            yield _LONG_EVENT  # resumes once the server has written it (or buffered it)
            stream.sent += 1
            # Between two events, as llama-server does, notice a closed connection and stop: uvicorn's
            # send returns at once after a disconnect, so without a pause the loop would never see it.
            await asyncio.sleep(0)
        yield tail
    finally:
        stream.ended = True


def fake_pod(received: list[dict[str, Any]], hits: list[Hit] | None = None,
             streams: list[Stream] | None = None) -> ASGIApp:
    """The fake; `received` collects inference bodies, `hits` every request the pod was asked, `streams`
    the long streams."""
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def props(request: Request) -> Response:
        return JSONResponse({
            "model_alias": MODEL, "model_path": f"/models/{MODEL}.gguf", "total_slots": SLOTS,
            "chat_template": TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>", "build_info": "fake",
            "default_generation_settings": {"n_ctx": 4096},
        })

    async def slots(request: Request) -> Response:
        return JSONResponse([{"id": i, "n_ctx": 4096, "is_processing": False} for i in range(SLOTS)])

    async def infer(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            error = {"code": 400, "message": "bad json", "type": "invalid_request_error"}
            return JSONResponse({"error": error}, status_code=400)
        received.append(body)
        slot = body.get("id_slot", -1)
        if body.get("stream"):
            events = [
                {"choices": [{"index": 0, "delta": {"content": "ok"}}], "object": "chat.completion.chunk"},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": TIMINGS,
                 "object": "chat.completion.chunk"},
            ]
            raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            if isinstance(long := body.get("fake_events"), int) and long > 0 and streams is not None:
                streams.append(stream := Stream(long))
                return StreamingResponse(_long(stream, raw), media_type="text/event-stream")
            return StreamingResponse(iter([raw]), media_type="text/event-stream")
        if isinstance(size := body.get("fake_bytes"), int) and size > 0 and streams is not None:
            return _large_answer(size, slot, body.get("fake_declare") is True, streams)
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "timings": TIMINGS, "id_slot": slot, "object": "chat.completion"})

    async def count_tokens(request: Request) -> Response:
        received.append(json.loads(await request.body()))
        return JSONResponse({"input_tokens": 12})

    async def embeddings(request: Request) -> Response:
        received.append(json.loads(await request.body()))
        usage = {"prompt_tokens": 2, "total_tokens": 2}
        return JSONResponse({"object": "list", "model": MODEL, "usage": usage,
                             "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.5]}]})

    async def anything_else(request: Request) -> Response:
        return JSONResponse({"caught": f"{request.method} {request.url.path}"})

    app = Starlette(routes=[
        Route("/health", health), Route("/props", props), Route("/slots", slots),
        Route("/v1/chat/completions", infer, methods=["POST"]),
        Route("/v1/completions", infer, methods=["POST"]),
        Route("/v1/messages", infer, methods=["POST"]),
        Route("/v1/responses", infer, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        # Last: Starlette prefers a route matching path and method over one matching the path only.
        Route("/{rest:path}", anything_else, methods=_METHODS),
    ])

    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and hits is not None:
            raw = scope.get("raw_path") or scope["path"].encode()
            query = scope.get("query_string", b"")
            target = (raw + (b"?" + query if query else b"")).decode("latin-1")
            background = any(k.decode("latin-1").lower() == BACKGROUND for k, _ in scope["headers"])
            hits.append(Hit(scope["method"], target, background))
        await app(scope, receive, send)

    return recorded

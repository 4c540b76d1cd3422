"""A fake llama-server for fuzzing the gateway: answers like the real one (health, props, slots, chat
and text completions, JSON or SSE) in microseconds, so that thousands of generated requests cost seconds.

What is fuzzed is the gateway's own parsing, auth, scheduling and proxying; what llama-server does with
a body is the real-server tests' business. The fake records the `id_slot` of every body it received.
"""

from __future__ import annotations

import json
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


def fake_pod(received: list[dict[str, Any]], hits: list[str] | None = None) -> ASGIApp:
    """The fake; `received` collects inference bodies, `hits` every "METHOD path" the pod was asked."""
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
            return StreamingResponse(iter([raw]), media_type="text/event-stream")
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "timings": TIMINGS, "id_slot": slot, "object": "chat.completion"})

    app = Starlette(routes=[
        Route("/health", health), Route("/props", props), Route("/slots", slots),
        Route("/v1/chat/completions", infer, methods=["POST"]),
        Route("/v1/completions", infer, methods=["POST"]),
        Route("/v1/messages", infer, methods=["POST"]),
    ])

    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and hits is not None:
            hits.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    return recorded

"""A fake llama-server fleet behind `httpx.MockTransport`, and a first-endpoint scheduler.

The fake is enough for the proxy's own behaviour (bytes relayed, bodies rewritten, disconnects, retries);
what llama-server itself does is covered by the real-server integration tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamafleet_core.types import Action
from llamafleet_router.scheduling.framework import Decision, EndpointState, SchedRequest

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TIMINGS = {"cache_n": 0, "prompt_n": 40, "predicted_n": 3, "prompt_ms": 5.0, "predicted_ms": 3.0}


def sse_chunks(timings: dict[str, Any] | None = None) -> list[bytes]:
    """What llama-server streams for a chat completion, cut at awkward places (mid-line, mid-CRLF)."""
    events = [
        {
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}],
            "object": "chat.completion.chunk",
        },
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}], "object": "chat.completion.chunk"},
        {"choices": [{"index": 0, "delta": {"content": "lo \u00e9"}}], "object": "chat.completion.chunk"},
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "object": "chat.completion.chunk",
            "timings": timings or TIMINGS,
        },
    ]
    raw = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\r\n\r\n" for e in events)
    raw += b"data: [DONE]\r\n\r\n"
    cuts = [7, 31, 32, len(raw) // 2, len(raw) // 2 + 1, len(raw) - 3]
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


class ChunkStream(httpx.AsyncByteStream):
    """An upstream body: yields chunks, optionally then fails or hangs; records when it is closed."""

    def __init__(
        self, chunks: Sequence[bytes], *, fail_after: int | None = None, hang_after: int | None = None
    ):
        self.chunks = list(chunks)
        self.fail_after = fail_after
        self.hang_after = hang_after
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self.chunks):
            if i == self.fail_after:
                raise httpx.ReadError("connection reset by peer")
            if i == self.hang_after:
                await asyncio.Event().wait()  # until cancelled/closed
            yield chunk

    async def aclose(self) -> None:
        self.closed.set()


@dataclass
class FakePod:
    url: str
    model: str = "tiny"
    n_slots: int = 2
    healthy: bool = True
    refuse_inference: bool = False
    busy: set[int] = field(default_factory=set)
    n_ctx: int = 4096
    requests: list[dict[str, Any]] = field(default_factory=list)
    streams: list[ChunkStream] = field(default_factory=list)
    stream_mode: dict[str, int] = field(default_factory=dict)  # fail_after / hang_after
    status: int = 200
    timings: dict[str, Any] | None = None
    embeddings: bool = True  # started with `--embeddings` (else it answers llama-server's 501)

    def props(self) -> dict[str, Any]:
        return {
            "total_slots": self.n_slots,
            "model_alias": self.model,
            "model_path": f"/m/{self.model}.gguf",
            "chat_template": TEMPLATE,
            "bos_token": "",
            "eos_token": "<|im_end|>",
            "build_info": "b1-test",
            "default_generation_settings": {"n_ctx": self.n_ctx},
        }

    def slots(self) -> list[dict[str, Any]]:
        return [{"id": i, "n_ctx": self.n_ctx, "is_processing": i in self.busy} for i in range(self.n_slots)]

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if not self.healthy:
            raise httpx.ConnectError("connection refused", request=request)
        if request.method == "GET" and path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.method == "GET" and path == "/props":
            return httpx.Response(200, json=self.props())
        if request.method == "GET" and path == "/slots":
            return httpx.Response(200, json=self.slots())
        if request.method == "POST" and path in ("/v1/messages/count_tokens", "/v1/embeddings"):
            return self._direct(request)
        if request.method == "POST" and path in ("/v1/chat/completions", "/v1/completions", "/v1/messages",
                                                 "/v1/responses"):
            if self.refuse_inference:
                raise httpx.ConnectError("connection refused", request=request)
            body = json.loads(request.content)
            self.requests.append({"path": path, "body": body, "headers": dict(request.headers)})
            if self.status >= 400:
                return httpx.Response(
                    self.status,
                    json={
                        "error": {
                            "code": self.status,
                            "message": "upstream says no",
                            "type": "invalid_request_error",
                        }
                    },
                )
            if body.get("stream"):
                stream = ChunkStream(sse_chunks(self.timings), **self.stream_mode)
                self.streams.append(stream)
                return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
            return httpx.Response(
                200,
                json={
                    "object": "chat.completion",
                    "id_slot": body.get("id_slot"),
                    "choices": [{"message": {"role": "assistant", "content": "hi"}}],
                    "timings": self.timings or TIMINGS,
                },
            )
        return httpx.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})

    def _direct(self, request: httpx.Request) -> httpx.Response:
        """A token count or an embedding (what llama-server answers, in its shape)."""
        path = request.url.path
        body = json.loads(request.content)
        self.requests.append({"path": path, "body": body, "headers": dict(request.headers)})
        if path == "/v1/messages/count_tokens":
            return httpx.Response(200, json={"input_tokens": 42})
        if not self.embeddings:
            message = "This server does not support embeddings. Start it with `--embeddings`"
            return httpx.Response(501, json={"error": {"code": 501, "message": message,
                                                       "type": "not_supported_error"}})
        return httpx.Response(200, json={"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}]})


class FakeFleet:
    """Pods by base URL, served through one MockTransport."""

    def __init__(self, *pods: FakePod) -> None:
        self.pods = {pod.url: pod for pod in pods}
        self.agents_ready: dict[str, bool] = {}  # agent base URL -> its /ready answer
        self.agents_body: dict[str, dict[str, object]] = {}  # agent base URL -> its /ready JSON body

    def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.agents_ready and request.url.path == "/ready":
            status = 200 if self.agents_ready[base] else 503
            return httpx.Response(status, json=self.agents_body.get(base, {}))
        pod = self.pods.get(base)
        if pod is None:
            raise httpx.ConnectError("no route to host", request=request)
        return pod.answer(request)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


class FirstEndpointScheduler:
    """Always the first endpoint (by URL) and its first idle slot; records releases."""

    speeds = None  # learns nothing

    def __init__(self) -> None:
        self.released: list[Decision] = []
        self.scheduled: list[Decision] = []

    async def schedule(self, req: SchedRequest, endpoints: Sequence[EndpointState]) -> Decision:
        state = sorted(endpoints, key=lambda s: s.endpoint.url)[0]
        slot = state.idle_slots[0] if state.idle_slots else -1
        decision = Decision(state.endpoint, slot, Action.DIRECT, None, 0, "cold", f"holder:{req.request_id}")
        self.scheduled.append(decision)
        return decision

    async def release(self, decision: Decision) -> None:
        self.released.append(decision)

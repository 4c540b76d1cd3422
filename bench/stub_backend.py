"""A fast stub llama-server: the upstream of the router-overhead benchmark.

It answers what a router needs from a llama-server pod, as cheaply as a Python process can, so that the
latency a client sees through a router minus the latency it sees directly is the router's own cost:

- `GET /health`, `GET /props` (a real chat template, `total_slots`, `model_path`, `build_info`),
  `GET /slots` (every slot idle), `GET /v1/models` and `/models`; anything else is a 404, which the
  routers under test tolerate (sglang-router probes a few sglang-only info endpoints).
- `POST /v1/chat/completions` and `/v1/completions`: a chunked `text/event-stream` of a fixed number of
  chunks, the last one carrying llama-server's `timings`, then `data: [DONE]`; or one JSON answer when
  the body does not ask for a stream. The first chunk is written at once; with `stream_ms > 0` the rest
  are spread over that many milliseconds (a generation that keeps the stream open).
- `timings.cache_n` imitates llama-server's slot reuse: the longest common prefix (in bytes / 4) of this
  body and the previous body pinned to the same `id_slot`. It is not a tokenizer, but it makes a router's
  after-response check see hits when it pins a prompt to the slot that held it, as on a real server.
- `POST /stub/config {"stream_ms": N}` changes the stream duration; `GET /stub/stats` counts requests.

It is a raw asyncio HTTP/1.1 server (keep-alive, Content-Length or chunked request bodies) rather than an
ASGI app: a framework would cost more CPU per request than the routers under test, and the benchmark runs
it in its own process so that its CPU is not charged to the router's event loop.

    python bench/stub_backend.py --port 18080 [--slots 64] [--chunks 6] [--stream-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_PATH = "/models/bench-model.gguf"
MODEL_NAME = "bench-model.gguf"  # what `model_name()` of the router derives from MODEL_PATH
TEMPLATE_FILE = "models/templates/Qwen3.5-4B.jinja"
_MAX_HEADER = 64 * 1024
_STATUS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def qwen_template() -> str:
    """The Qwen3.5 chat template from the llama.cpp source tree (the router renders prompts with it)."""
    from llamafleet_testbed.llama_build import source_dir

    return (source_dir() / TEMPLATE_FILE).read_text()


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix, by bisection on slice equality (memcmp, not a Python loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def slot_of(body: bytes) -> int:
    """`id_slot` of a request body without parsing the JSON (routers add it; -1 when absent)."""
    at = body.find(b'"id_slot":')
    if at < 0:
        return -1
    digits = body[at + 10 : at + 18].lstrip().split(b",")[0].split(b"}")[0].strip()
    return int(digits) if digits.lstrip(b"-").isdigit() else -1


def wants_stream(body: bytes) -> bool:
    compact = body.replace(b" ", b"")
    return b'"stream":true' in compact


@dataclass
class Stub:
    template: str
    slots: int = 64
    chunks: int = 6
    stream_ms: float = 0.0
    n_ctx: int = 65536
    last_body: dict[int, bytes] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    # ---- fixed answers ------------------------------------------------------------------------

    def props(self) -> dict[str, Any]:
        return {
            "default_generation_settings": {"n_ctx": self.n_ctx, "params": {}},
            "total_slots": self.slots,
            "model_alias": MODEL_PATH,
            "model_path": MODEL_PATH,
            "chat_template": self.template,
            "chat_template_caps": None,
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "build_info": "b0-benchstub",
            "is_sleeping": False,
        }

    def slots_json(self) -> list[dict[str, Any]]:
        return [{"id": i, "n_ctx": self.n_ctx // self.slots, "is_processing": False}
                for i in range(self.slots)]

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "llamacpp",
                                            "created": 0, "meta": {"n_ctx_train": self.n_ctx}}]}

    # ---- completions --------------------------------------------------------------------------

    def timings(self, body: bytes) -> tuple[dict[str, Any], int]:
        """llama-server's `timings` for this body, and the slot it was pinned to (-1: none)."""
        slot = slot_of(body)
        cached = common_prefix_len(body, self.last_body.get(slot, b"")) // 4 if slot >= 0 else 0
        if slot >= 0:
            self.last_body[slot] = body
        prompt_n = max(1, len(body) // 4 - cached)
        timings = {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": 1.0, "predicted_n": self.chunks,
                   "predicted_ms": 1.0, "predicted_per_second": 1000.0}
        return timings, slot

    def events(self, body: bytes) -> list[bytes]:
        """The SSE events of one streamed chat completion, as llama-server shapes them."""
        timings, slot = self.timings(body)
        now = int(time.time())
        head = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": now,
                "model": MODEL_NAME, "system_fingerprint": "b0-benchstub"}
        out = []
        for i in range(self.chunks - 1):
            delta = {"role": "assistant", "content": None} if i == 0 else {"content": f" tok{i}"}
            out.append({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        out.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                    "timings": timings, "id_slot": slot,
                    "usage": {"prompt_tokens": timings["cache_n"] + timings["prompt_n"],
                              "completion_tokens": self.chunks, "total_tokens": 0,
                              "prompt_tokens_details": {"cached_tokens": timings["cache_n"]}}})
        events = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in out]
        return [*events, b"data: [DONE]\n\n"]

    def answer(self, body: bytes) -> dict[str, Any]:
        timings, slot = self.timings(body)
        return {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL_NAME, "id_slot": slot, "timings": timings,
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": "tok " * self.chunks}}],
                "usage": {"prompt_tokens": timings["cache_n"] + timings["prompt_n"],
                          "completion_tokens": self.chunks, "total_tokens": 0}}

    # ---- HTTP ---------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while await self.one_request(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await read_body(reader, headers)
        path = target.split("?", 1)[0]
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        self.stats[path] += 1
        if method == "GET":
            routes: dict[str, Callable[[], Any]] = {
                "/health": lambda: {"status": "ok"}, "/props": self.props, "/slots": self.slots_json,
                "/v1/models": self.models, "/models": self.models, "/stub/stats": lambda: dict(self.stats),
            }
            make = routes.get(path)
            if make is None:
                write_json(writer, 404, {"error": {"code": 404, "message": "File Not Found"}}, keep)
            else:
                write_json(writer, 200, make(), keep)
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions", "/completion"):
            if wants_stream(body):
                await self.stream(writer, body, keep)
            else:
                write_json(writer, 200, self.answer(body), keep)
        elif method == "POST" and path == "/stub/config":
            self.stream_ms = float(json.loads(body or b"{}").get("stream_ms", self.stream_ms))
            self.last_body.clear()
            self.stats.clear()
            write_json(writer, 200, {"stream_ms": self.stream_ms}, keep)
        else:
            write_json(writer, 404, {"error": {"code": 404, "message": "File Not Found"}}, keep)
        await writer.drain()
        return keep

    async def stream(self, writer: asyncio.StreamWriter, body: bytes, keep: bool) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                     + (b"Keep-Alive: timeout=5, max=100000\r\n" if keep else b"Connection: close\r\n")
                     + b"\r\n")
        events = self.events(body)
        gap = self.stream_ms / 1000 / max(1, len(events) - 1)
        for i, event in enumerate(events):
            if i and gap > 0:
                await asyncio.sleep(gap)
            # One write per event: with TCP_NODELAY each is its own segment, as llama-server sends them.
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return b""


def write_json(writer: asyncio.StreamWriter, status: int, payload: Any, keep: bool) -> None:
    data = json.dumps(payload, separators=(",", ":")).encode()
    writer.write(
        f"HTTP/1.1 {status} {_STATUS.get(status, 'OK')}\r\nServer: llama.cpp\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
        f"{'Keep-Alive: timeout=5, max=100000' if keep else 'Connection: close'}\r\n\r\n".encode()
        + data
    )


async def serve(stub: Stub, host: str, port: int, ready_file: Path | None) -> None:
    server = await asyncio.start_server(stub.handle, host, port, limit=_MAX_HEADER, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    if ready_file is not None:
        await asyncio.to_thread(ready_file.write_text, str(bound))
    print(f"stub llama-server on http://{host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--chunks", type=int, default=6, help="SSE events before [DONE], the last with timings")
    p.add_argument("--stream-ms", type=float, default=0.0, help="spread the events over this many ms")
    p.add_argument("--ready-file", type=Path, help="write the bound port here once listening")
    args = p.parse_args()
    stub = Stub(qwen_template(), slots=args.slots, chunks=max(2, args.chunks), stream_ms=args.stream_ms)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(stub, args.host, args.port, args.ready_file))


if __name__ == "__main__":
    main()

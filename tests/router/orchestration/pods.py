"""A fake llama-server for the gateway's snapshot orchestration tests, served by aiohttp on loopback.

It is a fake for orchestration only: it implements just what the gateway calls (discovery's /health,
/props and /slots; first sight's /tokenize and `n_predict: 0` /completion; the proxied
/v1/chat/completions, streamed or not) and models no inference. What it keeps honest is the one thing
the orchestration is about: what each slot holds. A slot holds a list of token pieces; a request's
`cache_n` is its common prefix with the slot, `prompt_n` the rest, and the slot then holds the prompt
(plus the generated pieces). Chat prompts are rendered with the gateway's own template code from the
`/props` this fake serves, so both sides agree on the text.

Tokenizing: each line is cut into pieces of 4 characters, so a line start is always a token boundary
(as the BPE pre-tokenizer makes it for the stage cuts, `snapshots/cuts.py`), and the tokens of a text
cut at a line start are a prefix of the whole text's tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from llamafleet_core.prefix import ChatTemplate, chat_identity

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PIECE_CHARS = 4
ANSWER = ("Hel", "lo", " there")  # the pieces every generation produces (then stops)


def pieces_of(text: str) -> list[str]:
    """The fake's tokenization of `text` (pure): each line cut into pieces of PIECE_CHARS."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        out.extend(line[i : i + PIECE_CHARS] for i in range(0, len(line), PIECE_CHARS))
    return out


def common_prefix(a: list[str], b: list[str]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass
class Call:
    method: str
    path: str
    body: Any


@dataclass
class Cuts:
    """The next `left` streams (of the pods sharing this object) lose their connection after `after`
    events, as when their pod goes away mid-answer."""

    after: int
    left: int = 1

    def take(self) -> int | None:
        if self.left <= 0:
            return None
        self.left -= 1
        return self.after


@dataclass
class FakeLlama:
    """One pod's llama-server state: its slots' contents and every call it answered."""

    model: str = "tiny"
    n_slots: int = 4
    n_ctx: int = 65536
    slots: list[list[str]] = field(default_factory=list)
    tasks: list[int | None] = field(default_factory=list)  # each slot's last task id (GET /slots)
    busy: set[int] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    cuts: Cuts | None = None  # streams this pod (or several sharing it) cuts off
    _vocab: dict[str, int] = field(default_factory=dict)
    _pieces: list[str] = field(default_factory=list)
    _task: int = 0

    def __post_init__(self) -> None:
        self.slots = [[] for _ in range(self.n_slots)]
        self.tasks = [None] * self.n_slots

    def ids(self, pieces: list[str]) -> list[int]:
        for piece in pieces:
            if piece not in self._vocab:
                self._vocab[piece] = len(self._pieces)
                self._pieces.append(piece)
        return [self._vocab[p] for p in pieces]

    def pieces(self, ids: list[int]) -> list[str]:
        return [self._pieces[i] for i in ids]

    def slot_ids(self, slot: int) -> list[int]:
        return self.ids(self.slots[slot])

    def props(self) -> dict[str, Any]:
        return {
            "total_slots": self.n_slots, "model_alias": self.model, "model_path": f"/m/{self.model}.gguf",
            "chat_template": TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>", "build_info": "b1-fake",
            "default_generation_settings": {"n_ctx": self.n_ctx},
        }

    def calls_to(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]

    def _run(self, slot: int, prompt: list[str]) -> tuple[int, int]:
        """Compute `prompt` into `slot`: (cache_n, prompt_n), and the slot then holds the prompt."""
        cache_n = common_prefix(self.slots[slot], prompt)
        if cache_n == len(prompt) and cache_n:  # llama-server evaluates the last token again
            cache_n -= 1
        self.slots[slot] = list(prompt)
        self._task += 1
        self.tasks[slot] = self._task
        return cache_n, len(prompt) - cache_n

    def _slot_for(self, body: dict[str, Any]) -> int:
        slot = int(body.get("id_slot", -1))
        if slot < 0:
            slot = next(i for i in range(self.n_slots) if i not in self.busy)
        return slot

    # --- handlers ---

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def get_props(self, request: web.Request) -> web.Response:
        return web.json_response(self.props())

    async def get_slots(self, request: web.Request) -> web.Response:
        return web.json_response([
            {"id": i, "n_ctx": self.n_ctx, "is_processing": i in self.busy,
             "n_prompt_tokens": len(self.slots[i]) or None, "id_task": self.tasks[i]}
            for i in range(self.n_slots)])

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("POST", "/tokenize", body))
        pieces = pieces_of(str(body["content"]))
        ids = self.ids(pieces)
        if body.get("with_pieces"):
            items = [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]
            return web.json_response({"tokens": items})
        return web.json_response({"tokens": ids})

    async def completion(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(Call("POST", "/completion", body))
        prompt = body["prompt"]
        pieces = pieces_of(prompt) if isinstance(prompt, str) else self.pieces([int(t) for t in prompt])
        slot = self._slot_for(body)
        cache_n, prompt_n = self._run(slot, pieces)
        return web.json_response({"content": "", "id_slot": slot, "tokens_evaluated": len(pieces),
                                  "timings": {"cache_n": cache_n, "prompt_n": prompt_n}})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append(Call("POST", "/v1/chat/completions", body))
        text = chat_identity(body, ChatTemplate.from_props(self.props()), model=self.model).text
        slot = self._slot_for(body)
        cache_n, prompt_n = self._run(slot, pieces_of(text))
        self.slots[slot] += list(ANSWER)
        timings = {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": len(ANSWER),
                   "prompt_ms": 1.0, "predicted_ms": 1.0}
        if not body.get("stream"):
            return web.json_response({
                "object": "chat.completion", "id_slot": slot, "timings": timings,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(ANSWER)}}],
                "usage": {"prompt_tokens": cache_n + prompt_n, "completion_tokens": len(ANSWER)}})
        return await self._stream(request, slot, timings)

    async def _stream(self, request: web.Request, slot: int, timings: dict[str, Any]) -> web.StreamResponse:
        events: list[dict[str, Any]] = [
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}}]}
            for p in ANSWER]
        events.append({"object": "chat.completion.chunk", "timings": timings,
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        cut = self.cuts.take() if self.cuts is not None else None
        self.busy.add(slot)
        try:
            await resp.prepare(request)
            for i, event in enumerate(events):
                if i == cut:
                    # The pod goes away mid-answer: the connection closes with no end of stream.
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                # Compact, as llama-server writes it (the proxy looks for `"content":"` in the head).
                await resp.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            self.busy.discard(slot)
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/props", self.get_props)
        app.router.add_get("/slots", self.get_slots)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/completion", self.completion)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


async def serve_app(app: web.Application) -> TestServer:
    """`app` on a free loopback port (the caller closes it)."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def base_url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")

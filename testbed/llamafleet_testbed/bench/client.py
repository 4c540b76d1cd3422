"""One streamed chat request, measured as an agent client feels it.

TTFT is the time from sending the request to the first SSE event that carries content (text, reasoning
text or a tool call): llama-server first sends a role-only event, which says nothing about the prompt
having been computed, and a router may flush headers long before the model answers. The output is kept
as the list of content pieces, one per event (llama-server streams one token per event), so that greedy
outputs can be compared position by position with a cold run.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Reply:
    """What one streamed request gave: timing, output pieces, the server's `timings`, router headers."""

    status: int
    ttft_s: float
    total_s: float
    pieces: list[str] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    retries: int = 0

    @property
    def cache_n(self) -> int:
        return int(self.timings.get("cache_n", 0))

    @property
    def prompt_n(self) -> int:
        return int(self.timings.get("prompt_n", 0))

    @property
    def decode_tps(self) -> float:
        return float(self.timings.get("predicted_per_second", 0.0))

    def summary(self) -> dict[str, Any]:
        """JSON-able raw figures (the output pieces are kept: agreement is recomputed from them)."""
        keep = ("x-llamafleet-pod", "x-llamafleet-slot", "x-llamafleet-action", "x-llamafleet-snapshot")
        return {
            "status": self.status, "ttft_s": round(self.ttft_s, 4), "total_s": round(self.total_s, 4),
            "cache_n": self.cache_n, "prompt_n": self.prompt_n, "decode_tps": round(self.decode_tps, 1),
            "pieces": self.pieces, "headers": {k: v for k, v in self.headers.items() if k in keep},
            "error": self.error, "retries": self.retries,
        }


def content_of(event: dict[str, Any]) -> str | None:
    """The content an SSE chat event carries (None: no content, e.g. the role-only first event)."""
    choices = event.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    if text:
        return text
    if delta.get("tool_calls"):
        return json.dumps(delta["tool_calls"], sort_keys=True)
    return None


async def stream_chat(http: httpx.AsyncClient, url: str, body: dict[str, Any], *,
                      first_content: asyncio.Event | None = None, timeout: float = 600.0,
                      retries: int = 1) -> Reply:
    """POST `body` (streaming) to `url`/v1/chat/completions and read the stream to its end.

    `first_content` is set when the first content event arrives (the session is generating), which is
    when the concurrent-session scenario starts the next sessions. Never raises on HTTP errors: the
    benchmark records a failed request instead of aborting the whole run. A request that got no answer
    at all (the connection dropped before any response byte) or a 502 (a router lost its upstream
    before answering) is retried `retries` times, as agent clients do: llama-server's HTTP library closes
    a keep-alive connection after 5 requests, so a reused connection can be gone. The reply records the
    retry, and its TTFT and total include the failed attempt."""
    started = time.perf_counter()
    for attempt in range(retries + 1):
        reply = await _once(http, url, body, first_content, timeout, started)
        reply.retries = attempt
        if reply.status not in (0, 502) or reply.pieces:
            break
    if first_content is not None:
        first_content.set()  # never leave a waiting scenario hanging on a failed request
    return reply


async def _once(http: httpx.AsyncClient, url: str, body: dict[str, Any], first_content: asyncio.Event | None,
                timeout: float, started: float) -> Reply:
    body = {**body, "stream": True}
    ttft = 0.0
    reply = Reply(status=0, ttft_s=0.0, total_s=0.0)
    try:
        async with asyncio.timeout(timeout):
            async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                reply.status = resp.status_code
                reply.headers = {k.lower(): v for k, v in resp.headers.items()}
                if resp.status_code != 200:
                    reply.error = (await resp.aread()).decode(errors="replace")[:500]
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "timings" in event:
                        reply.timings = event["timings"]
                    piece = content_of(event)
                    if piece is None:
                        continue
                    if not reply.pieces:
                        ttft = time.perf_counter() - started
                        if first_content is not None:
                            first_content.set()
                    reply.pieces.append(piece)
    except (httpx.HTTPError, TimeoutError) as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    reply.ttft_s = ttft if reply.pieces else time.perf_counter() - started
    reply.total_s = time.perf_counter() - started
    return reply

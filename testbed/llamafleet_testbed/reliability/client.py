"""The steady agent workload of the fault scenarios: bounded in count, concurrency and time.

`send(...)` makes one chat request and records what the client saw (`Sent`). With several gateway URLs
it behaves like a client with a retry policy: a request that got no answer (connection refused or
dropped, no status) is tried on the next gateway, at most `attempts` times. An answer, even an error,
is never retried: the figures must show failures, not hide them.

`Load` runs `count` requests with `concurrency` workers, each request bounded by `timeout` seconds (a
request over its deadline is LOST: that is a hang), and exposes how far it got, and which requests are
in progress and where (`streaming_on`), so a scenario can inject its fault at the moment it must hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamafleet_testbed.reliability.outcome import Sent, parse_json, parse_sse

QUESTIONS = (
    "Which file defines the scheduler?", "List the failing tests.", "Summarize the last commit.",
    "What does the retry flag do?", "Where is the cache configured?", "Explain the error on line 12.",
)


def chat_body(model: str, system: str, question: str, *, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "temperature": 0, "seed": 42, "stream": stream,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _once(http: httpx.AsyncClient, url: str, body: dict[str, Any], sent: Sent,
                headers: dict[str, str]) -> None:
    sent.gateway = url
    async with http.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as resp:
        sent.status = resp.status_code
        h = resp.headers
        sent.pod, sent.action = h.get("x-llamafleet-pod", ""), h.get("x-llamafleet-action", "")
        sent.slot = int(h.get("x-llamafleet-slot", "-1"))
        sent.snapshot = h.get("x-llamafleet-snapshot", "")
        raw = bytearray()
        async for chunk in resp.aiter_raw():
            if sent.first_byte is None:
                sent.first_byte = time.monotonic()
            raw += chunk
    if sent.stream and resp.status_code == 200:
        sent.terminal, sent.error_event, sent.text, sent.cache_n = parse_sse(bytes(raw))
    elif resp.status_code == 200:
        sent.terminal, sent.text, sent.cache_n = parse_json(bytes(raw))
    else:
        sent.detail = bytes(raw[:300]).decode(errors="replace")


async def send(http: httpx.AsyncClient, urls: Sequence[str], body: dict[str, Any], *, n: int = 0,
               timeout: float = 30.0, attempts: int = 1, first: int = 0,
               headers: dict[str, str] | None = None, sent: Sent | None = None) -> Sent:
    """One request; on no answer at all, retried on the next of `urls` (at most `attempts` tries).
    `sent`: the record to fill in, for a caller that watches the request while it runs."""
    if sent is None:
        sent = Sent(n=n, started=time.monotonic(), stream=bool(body.get("stream")))
    deadline = sent.started + timeout
    for attempt in range(attempts):
        sent.attempts = attempt + 1
        url = urls[(first + attempt) % len(urls)]
        sent.status, sent.error, sent.first_byte, sent.terminal = None, "", None, False
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                await _once(http, url, body, sent, headers or {})
        except TimeoutError:
            sent.error = f"no complete answer within {timeout:.0f}s"
            break  # a hang: retrying would only hide it
        except httpx.HTTPError as exc:
            sent.error = f"{type(exc).__name__}: {exc}"  # no (complete) answer: the next gateway
        if sent.status is not None and (sent.terminal or sent.status != 200 or sent.error_event):
            break  # an answer (good or bad): never retried
    sent.ended = time.monotonic()
    return sent


@dataclass
class Load:
    """`count` requests through `urls` by `concurrency` workers; `bodies(i)` makes request i."""

    http: httpx.AsyncClient
    urls: Sequence[str]
    bodies: Callable[[int], dict[str, Any]]
    count: int
    concurrency: int = 2
    timeout: float = 30.0
    attempts: int = 1
    gap: float = 0.0  # seconds a worker waits between its requests (a steady, not a saturating, load)
    results: list[Sent] = field(default_factory=list)
    started: int = 0
    running: dict[int, Sent] = field(default_factory=dict)  # requests in progress, by number
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set: no new request is started
    _finished: asyncio.Event = field(default_factory=asyncio.Event)  # set at every finished request

    @property
    def done(self) -> int:
        return len(self.results)

    async def run(self) -> list[Sent]:
        next_n = iter(range(self.count))

        async def worker(w: int) -> None:
            for i in next_n:
                if self.stop.is_set():
                    return
                self.started += 1
                body = self.bodies(i)
                sent = Sent(n=i, started=time.monotonic(), stream=bool(body.get("stream")))
                self.running[i] = sent
                try:
                    await send(self.http, self.urls, body, n=i, timeout=self.timeout,
                               attempts=self.attempts, first=i, sent=sent)
                finally:
                    del self.running[i]
                self.results.append(sent)
                self._finished.set()
                if self.gap:
                    await asyncio.sleep(self.gap)

        await asyncio.gather(*(worker(w) for w in range(self.concurrency)))
        return sorted(self.results, key=lambda s: s.n)

    def streaming_on(self, pod: str) -> list[Sent]:
        """Streams in progress whose answer comes from `pod` and has started (first bytes received):
        the ones a fault on that pod cuts."""
        return [s for s in self.running.values()
                if s.stream and s.pod == pod and s.first_byte is not None and not s.terminal]

    async def wait_done(self, n: int, limit: float = 60.0) -> None:
        """Until at least `n` requests finished (bounded by `limit` seconds)."""
        deadline = time.monotonic() + limit
        while self.done < n and time.monotonic() < deadline:
            self._finished.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._finished.wait()

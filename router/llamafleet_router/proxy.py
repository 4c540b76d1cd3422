"""Forward one request to the chosen pod and relay its answer.

- Streaming answers (`text/event-stream`) are relayed chunk by chunk exactly as received (`aiter_raw`);
  a copy goes to `SSETap` to read the final `timings`/`usage`. Nothing the client receives is changed.
- Other answers (including upstream errors) are relayed with their status and body.
- A refused or timed-out connect raises `PodUnreachable` before anything was sent to the client, so the
  caller can mark the pod down and schedule again.
- A stream that fails midway ends with an SSE error event instead of hanging.

`on_finish(outcome, close)` is called exactly once per response, synchronously (also when the client
disconnects and the relay is cancelled; for streams, as soon as the terminal event is read and before it
is relayed, so that the next request finds the slot idle), with a coroutine function that closes the
upstream response once the relay stopped reading it; the caller gives back its bookkeeping at once and
runs the rest (lease release, index writes, close) in a background task. Awaiting in a `finally` of a
cancelled relay is not reliable (anyio cancel scopes cancel every await), hence this split.
Starlette's `BackgroundTask` is not used: it does not run on disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import httpx
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from llamafleet_router.errors import SERVER, ApiError, sse_error_event
from llamafleet_router.hooks import Outcome
from llamafleet_router.sse import SSETap, stats_from_body

log = logging.getLogger(__name__)

OnFinish = Callable[[Outcome, Callable[[], Awaitable[None]]], None]
OnFirstByte = Callable[[float], None]

# Hop-by-hop headers (RFC 9110 7.6.1) and those Starlette recomputes.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "content-length", "date", "server"}


class PodUnreachable(Exception):
    """The pod refused the connection or did not accept it in time; nothing reached the client."""


def response_headers(upstream: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in upstream.items() if k.lower() not in _DROP}


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator, so the relay's `finally` runs at once
    when the client disconnects (Starlette leaves a suspended generator to the garbage collector)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def forward(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    on_finish: OnFinish,
    on_first_byte: OnFirstByte | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> Response:
    """Send `body` to `url` and relay the answer; `extra_headers` are added to the client's response
    (the routing decision, for operators and tests)."""
    request = http.build_request("POST", url, content=body, headers=dict(headers))
    started = time.perf_counter()
    try:
        upstream = await http.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise PodUnreachable(f"{type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        on_finish(Outcome(status=502, error=str(exc)), _noop)
        raise ApiError(502, f"The upstream server failed before answering: {type(exc).__name__}",
                       type=SERVER, code="upstream_error") from exc

    content_type = upstream.headers.get("content-type", "")
    if upstream.status_code >= 400 or not content_type.startswith("text/event-stream"):
        response = await _buffered(upstream, started, on_finish, on_first_byte)
        response.headers.update(extra_headers or {})
        return response
    return RelayResponse(
        _relay(upstream, started, on_finish, on_first_byte),
        status_code=upstream.status_code,
        headers={**response_headers(upstream.headers), **(extra_headers or {})},
    )


async def _noop() -> None:
    return None


async def _buffered(
    upstream: httpx.Response, started: float, on_finish: OnFinish, on_first_byte: OnFirstByte | None
) -> Response:
    # A non-streaming llama-server answer sends its headers when the whole answer is ready.
    if on_first_byte is not None and upstream.status_code < 400:
        on_first_byte(time.perf_counter() - started)
    outcome = Outcome(status=upstream.status_code, error="cancelled")
    try:
        content = await upstream.aread()
        stats = stats_from_body(content) if upstream.status_code < 400 else None
        outcome = Outcome(status=upstream.status_code, stats=stats, completed=True,
                          served_slot=_served_slot(content))
    except httpx.HTTPError as exc:
        outcome = Outcome(status=502, error=str(exc))
        raise ApiError(502, f"The upstream server failed while answering: {type(exc).__name__}",
                       type=SERVER, code="upstream_error") from exc
    finally:
        on_finish(outcome, upstream.aclose)
    # `aread` decodes any content-encoding (we ask for identity anyway), so that header must go.
    headers = response_headers(upstream.headers)
    headers.pop("content-encoding", None)
    return Response(content, status_code=upstream.status_code, headers=headers)


def _served_slot(content: bytes) -> int | None:
    # llama-server's native answers carry `id_slot`; only used when the decision left the slot open.
    marker = content.find(b'"id_slot":')
    if marker < 0:
        return None
    digits = content[marker + 10 : marker + 16].split(b",")[0].split(b"}")[0].strip()
    return int(digits) if digits.lstrip(b"-").isdigit() else None


async def _relay(
    upstream: httpx.Response, started: float, on_finish: OnFinish, on_first_byte: OnFirstByte | None
) -> AsyncIterator[bytes]:
    tap = SSETap()
    first = True
    completed = False
    error: str | None = None
    finished = False
    # Set once this relay has stopped reading upstream: only then may the upstream response be closed
    # (closing it under a running `aiter_raw` would break the relay's last read).
    drained = asyncio.Event()

    async def close_when_drained() -> None:
        await drained.wait()
        await upstream.aclose()

    def finish() -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        on_finish(
            Outcome(
                status=upstream.status_code,
                stats=tap.stats if completed else None,
                completed=completed,
                disconnected=not completed and error is None,
                error=error,
            ),
            close_when_drained,
        )

    try:
        try:
            async for chunk in upstream.aiter_raw():
                if first and on_first_byte is not None:
                    on_first_byte(time.perf_counter() - started)
                first = False
                tap.feed(chunk)
                if tap.finished and not completed:
                    # Give the slot back BEFORE the client can see the end of the stream: an agent
                    # sends its next turn at once, and it must find its slot idle, not still ours.
                    tap.close()
                    completed = True
                    finish()
                yield chunk
            tap.close()
            completed = True
        except httpx.HTTPError as exc:
            if not completed:
                error = f"{type(exc).__name__}: {exc}"
                log.warning("upstream stream failed midway", extra={"error": error})
                yield sse_error_event(f"The upstream server failed midway: {type(exc).__name__}")
    finally:
        drained.set()
        finish()  # a no-op when the terminal event already finished it

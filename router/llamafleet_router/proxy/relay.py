"""Relay one upstream stream to the client: chunk by chunk, unchanged, with a tap on the side.

Split from proxy.py (which opens the upstream request and decides between a stream and a buffered
answer) because the streaming half has its own concerns: the first chunks are held back until the pod
really answers (`head_of_stream`), the stream's end is reported exactly once and BEFORE the client sees
it (`relay`), and a client that leaves, or a pod that hangs mid-stream, cancels the relay at once
(`RelayResponse`). See proxy.py's docstring for the `on_finish` contract.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llamafleet_router.errors import sse_error_event
from llamafleet_router.proxy.gone import GoneSignal
from llamafleet_router.proxy.sse import SSETap, Stats

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Outcome:
    """How one proxied response ended."""

    status: int
    stats: Stats | None = None
    completed: bool = False  # the upstream body was read to its end
    disconnected: bool = False  # the client went away first
    error: str | None = None  # the upstream failed midway
    served_slot: int | None = None  # the slot llama-server reports it used, when it says


OnFinish = Callable[[Outcome, Callable[[], Awaitable[None]]], None]
OnFirstByte = Callable[[float], None]
OnAnswerStart = Callable[[], None]
ErrorEvent = Callable[[str], bytes]  # the SSE event ending a stream cut midway, in the route's shape


class RelayResponse(StreamingResponse):
    """A streamed response without Starlette's per-response task group and send wrappers.

    The relay loop sends each chunk as it arrives; one small task waits for the client's disconnect and
    cancels the relay, whose `finally` then reports the disconnect at once (so the slot is freed and the
    upstream connection closed, which stops the generation). The body iterator is always closed, so the
    relay's `finally` never waits for the garbage collector."""

    def __init__(self, *args: Any, give_up: GoneSignal | None = None,
                 error_event: ErrorEvent = sse_error_event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.give_up = give_up  # set when discovery marks the pod down (hung): end the stream
        self.error_event = error_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = asyncio.current_task()
        streaming = True
        gone = False
        abandoned = False

        async def watch() -> None:
            nonlocal gone
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
            if streaming and relay is not None:
                gone = True
                relay.cancel()

        def abandon() -> None:
            # A pod that hangs mid-stream would hold the client until it wakes: end the stream with an
            # SSE error event instead, as for a pod that dies.
            nonlocal abandoned
            if streaming and relay is not None and not abandoned:
                abandoned = True
                relay.cancel()

        watcher = asyncio.create_task(watch())
        if self.give_up is not None:
            self.give_up.add(abandon)
        try:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            streaming = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not (gone or abandoned) or relay is None:
                raise
            relay.uncancel()  # our own cancel: the client left, or the pod hangs
            if abandoned and not gone:
                event = self.error_event("The upstream server stopped answering mid-stream.")
                await send({"type": "http.response.body", "body": event, "more_body": False})
        finally:
            streaming = False
            watcher.cancel()
            if self.give_up is not None:
                self.give_up.discard(abandon)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


# Bytes that show a stream has really started answering (generated text, a tool call, the end, or an
# error); llama-server may send a role-only chunk before it has computed the prompt.
_ANSWERING = (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"tool_calls"', b"[DONE]",
              b'"content_block_delta"', b'"error"', b'"timings"', b'"response.output_text.delta"',
              b'"response.output_item.added"')
_HEAD_LIMIT = 64 * 1024


async def head_of_stream(upstream: aiohttp.ClientResponse) -> bytes:
    """The stream's first chunks, up to the first one that answers: held back so that a pod dying
    during its prefill fails before the client saw anything, and the request can move."""
    head = bytearray()
    async for chunk in upstream.content.iter_any():
        head += chunk
        if len(head) > _HEAD_LIMIT or any(mark in head for mark in _ANSWERING):
            break
    return bytes(head)


async def prepend(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if head:
        yield head
    async for chunk in rest:
        yield chunk


async def relay(
    chunks: AsyncIterator[bytes],
    status: int,
    close: Callable[[], Awaitable[None]],
    errors: type[Exception] | tuple[type[Exception], ...],
    started: float,
    on_finish: OnFinish,
    on_first_byte: OnFirstByte | None,
    on_answer_start: OnAnswerStart | None = None,
    *,
    error_event: ErrorEvent = sse_error_event,
) -> AsyncIterator[bytes]:
    """Yield the upstream's body chunks unchanged while a tap reads them; report the end exactly once.

    `errors` are the upstream client's failures: one midway ends the stream with an SSE error event.
    `on_first_byte` gets the seconds since `started`; `on_answer_start` is called as the first chunk
    goes to the client (both before the end is reported, when one chunk holds the whole answer)."""
    tap = SSETap()
    first = True
    completed = False
    error: str | None = None
    finished = False
    # Set once this relay has stopped reading upstream: only then may the upstream response be closed
    # (closing it under a running read would break the relay's last read).
    drained = asyncio.Event()

    async def close_when_drained() -> None:
        await drained.wait()
        await close()

    def finish() -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        on_finish(
            Outcome(
                status=status,
                stats=tap.stats if completed else None,
                completed=completed,
                disconnected=not completed and error is None,
                error=error,
            ),
            close_when_drained,
        )

    try:
        try:
            async for chunk in chunks:
                if first and on_first_byte is not None:
                    on_first_byte(time.perf_counter() - started)
                if first and on_answer_start is not None:
                    on_answer_start()
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
        except errors as exc:
            if not completed:
                error = f"{type(exc).__name__}: {exc}"
                log.warning("upstream stream failed midway", extra={"error": error})
                yield error_event(f"The upstream server failed midway: {type(exc).__name__}")
    finally:
        drained.set()
        finish()  # a no-op when the terminal event already finished it

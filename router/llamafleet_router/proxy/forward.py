"""Forward one request to the chosen pod and relay its answer.

- Streaming answers (`text/event-stream`) are relayed chunk by chunk exactly as received (decoded from
  the HTTP framing, never from a content-encoding); a copy goes to `SSETap` to read the final
  `timings`/`usage`. Nothing the client receives is changed.
- Other answers (including upstream errors) are relayed with their status and body.
- A refused or timed-out connect raises `PodUnreachable` before anything was sent to the client, so the
  caller can mark the pod down and schedule again.
- A stream that fails midway ends with an SSE error event instead of hanging (`error_event`: in the
  shape of the route's API).

`on_finish(outcome, close)` is called exactly once per response, synchronously (also when the client
disconnects and the relay is cancelled; for streams, as soon as the terminal event is read and before it
is relayed, so that the next request finds the slot idle), with a coroutine function that closes the
upstream response once the relay stopped reading it; the caller gives back its bookkeeping at once and
runs the rest (lease release, index writes, close) in a background task. Awaiting in a `finally` of a
cancelled relay is not reliable (anyio cancel scopes cancel every await), hence this split.
Starlette's `BackgroundTask` is not used: it does not run on disconnect.

Two upstream clients: the app's own `GatewayClient` carries an aiohttp session, which the proxy uses
(see upstream.py for why); any other `httpx.AsyncClient` (tests inject one over a MockTransport) is
used as is. Both feed the same relay (relay.py: the streaming half).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import httpx
import orjson
from starlette.responses import Response

from llamafleet_router.errors import SERVER, ApiError, sse_error_event
from llamafleet_router.proxy.gone import GoneSignal, PodUnreachable, unless_gone
from llamafleet_router.proxy.relay import (
    ErrorEvent,
    OnAnswerStart,
    OnFinish,
    OnFirstByte,
    Outcome,
    RelayResponse,
    head_of_stream,
    prepend,
    relay,
)
from llamafleet_router.proxy.sse import stats_from_body
from llamafleet_router.proxy.upstream import GatewayClient

# Hop-by-hop headers (RFC 9110 7.6.1) and those Starlette recomputes.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "content-length", "date", "server"}


def response_headers(upstream: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The upstream's headers minus hop-by-hop ones (items of httpx or aiohttp headers)."""
    return {k: v for k, v in upstream if k.lower() not in _DROP}


# What the router sets on every forwarded body, whatever the client sent: the slot, and prompt caching.
ROUTER_FIELDS = frozenset(("id_slot", "cache_prompt"))


def encoded_body(body: dict[str, Any], verbatim: Mapping[str, bytes] | None = None) -> bytes:
    """The body forwarded to llama-server, encoded once per request, without the router's fields
    (`pinned_body` adds them per attempt). `verbatim`: fields whose JSON the caller already holds (a
    learned tool list, as the client wrote it: `api/known_tools.py`), written as those bytes.

    The request holds these bytes, not the parsed body, while a pod computes its prompt (a retry before
    the first answer needs them): a 60K-character agent request parses into ~400 containers and 2.3
    times its bytes, and at 64 streams the parsed bodies waiting on their pods were most of what the
    garbage collector's young generation walked."""
    rest = {k: v for k, v in body.items() if k not in ROUTER_FIELDS}
    try:
        if verbatim:  # same key order: a replaced key keeps its place
            return orjson.dumps({**rest, **{k: orjson.Fragment(v) for k, v in verbatim.items() if k in rest}})
        return orjson.dumps(rest)  # ~30x faster than json.dumps for an agent request
    except TypeError:  # an integer past 64 bits: the standard encoder writes it as is
        return json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode()


def pinned_body(encoded: bytes, slot: int) -> bytes:
    """`encoded` (`encoded_body`) pinned to the chosen slot, with prompt caching on.

    A client's own `id_slot` was dropped by `encoded_body`: clients never choose the slot (design
    invariant)."""
    pin = b'"id_slot":%d,"cache_prompt":true}' % slot
    return encoded[:-1] + (pin if encoded == b"{}" else b"," + pin)


async def forward(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    on_finish: OnFinish,
    on_first_byte: OnFirstByte | None = None,
    extra_headers: Mapping[str, str] | None = None,
    give_up: GoneSignal | None = None,
    max_response_bytes: int | None = None,
    on_answer_start: OnAnswerStart | None = None,
    error_event: ErrorEvent = sse_error_event,
) -> Response:
    """Send `body` to `url` and relay the answer; `extra_headers` are added to the client's response
    (the routing decision, for operators and tests). `on_first_byte` gets the seconds from sending to
    the pod's first byte; `on_answer_start` is called once a successful answer's first byte goes to
    the client (a buffered answer's once it was read whole). When `give_up` is set before the pod's first
    byte (discovery found the pod hung or gone), PodUnreachable: the request goes elsewhere. A
    non-streamed answer larger than `max_response_bytes` is cut off: 502."""
    limit = max_response_bytes  # None: unbounded (tests of the proxy alone)
    if isinstance(http, GatewayClient):
        return await _forward_aiohttp(http.session(), url, body, headers, on_finish, on_first_byte,
                                      extra_headers, give_up, limit, on_answer_start, error_event)
    request = http.build_request("POST", url, content=body, headers=dict(headers))
    started = time.perf_counter()
    try:
        upstream = await http.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise PodUnreachable(f"{type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        on_finish(Outcome(status=502, error=str(exc)), _noop)
        raise _upstream_error("before answering", exc) from exc

    status, content_type = upstream.status_code, upstream.headers.get("content-type", "")
    if status >= 400 or not content_type.startswith("text/event-stream"):
        return await _answer_buffered(upstream.aiter_bytes(), upstream.aclose, httpx.HTTPError, status,
                                      upstream.headers.items(), started, on_finish, on_first_byte,
                                      extra_headers, limit, on_answer_start)
    return RelayResponse(
        relay(upstream.aiter_raw(), status, upstream.aclose, httpx.HTTPError, started, on_finish,
              on_first_byte, on_answer_start, error_event=error_event),
        status_code=status,
        headers={**response_headers(upstream.headers.items()), **(extra_headers or {})},
        error_event=error_event,
    )


async def _forward_aiohttp(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    on_finish: OnFinish,
    on_first_byte: OnFirstByte | None,
    extra_headers: Mapping[str, str] | None,
    give_up: GoneSignal | None = None,
    limit: int | None = None,
    on_answer_start: OnAnswerStart | None = None,
    error_event: ErrorEvent = sse_error_event,
) -> Response:
    started = time.perf_counter()
    upstream, head = await unless_gone(give_up, _open(session, url, body, headers, on_finish))

    async def close() -> None:
        upstream.release()  # back to the pool when read to the end, else the connection is closed

    status = upstream.status
    if head is None:
        return await _answer_buffered(upstream.content.iter_any(), close, (aiohttp.ClientError, TimeoutError),
                                      status, upstream.headers.items(), started, on_finish, on_first_byte,
                                      extra_headers, limit, on_answer_start)
    return RelayResponse(
        relay(prepend(head, upstream.content.iter_any()), status, close, aiohttp.ClientError, started,
              on_finish, on_first_byte, on_answer_start, error_event=error_event),
        status_code=status,
        headers={**response_headers(upstream.headers.items()), **(extra_headers or {})},
        give_up=give_up, error_event=error_event,
    )


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str], on_finish: OnFinish
) -> aiohttp.ClientResponse:
    """POST once, and once more on a fresh connection when a pooled keep-alive connection turns out
    to be closed by the pod (it closes idle ones after a few seconds); PodUnreachable when the pod
    itself is gone."""
    for attempt in range(2):
        try:
            return await session.post(url, data=body, headers=dict(headers), allow_redirects=False)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise PodUnreachable(f"{type(exc).__name__}: {exc}") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # Nothing was answered: safe to send again, and a dead pod then refuses the connect.
            if attempt == 1:
                raise PodUnreachable(f"{type(exc).__name__}: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            on_finish(Outcome(status=502, error=str(exc)), _noop)
            raise _upstream_error("before answering", exc) from exc
    raise AssertionError("unreachable")


async def _open(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str], on_finish: OnFinish
) -> tuple[aiohttp.ClientResponse, bytes | None]:
    """The upstream response and, for a stream, its first chunk (None for a buffered answer).

    llama-server sends its 200 before the prompt is computed: a pod that dies during prefill fails
    while we wait for the first chunk, before anything reached the client, so the request can still go
    to another pod."""
    upstream = await _post(session, url, body, headers, on_finish)
    if upstream.status >= 400 or not upstream.headers.get("content-type", "").startswith(
            "text/event-stream"):
        return upstream, None
    try:
        return upstream, await head_of_stream(upstream)
    except (aiohttp.ClientError, TimeoutError) as exc:
        upstream.close()
        raise PodUnreachable(f"failed before its first byte: {type(exc).__name__}: {exc}") from exc
    except asyncio.CancelledError:
        upstream.close()
        raise


async def _noop() -> None:
    return None


def _upstream_error(when: str, exc: Exception) -> ApiError:
    return ApiError(502, f"The upstream server failed {when}: {type(exc).__name__}", type=SERVER,
                    code="upstream_error")


async def _answer_buffered(
    chunks: AsyncIterator[bytes],
    close: Callable[[], Awaitable[None]],
    errors: type[Exception] | tuple[type[Exception], ...],
    status: int,
    upstream_headers: Iterable[tuple[str, str]],
    started: float,
    on_finish: OnFinish,
    on_first_byte: OnFirstByte | None,
    extra_headers: Mapping[str, str] | None,
    limit: int | None = None,
    on_answer_start: OnAnswerStart | None = None,
) -> Response:
    """A non-streamed answer (an error status, or `stream: false`): read it whole, but never more than
    `limit` bytes (a larger one is given up at once, by its Content-Length or by counting, and the
    client gets a 502), report it exactly once, and answer it. `errors` are the upstream client's
    failures while reading."""
    if on_first_byte is not None and status < 400:
        on_first_byte(time.perf_counter() - started)
    upstream_headers = list(upstream_headers)
    outcome = Outcome(status=status, error="cancelled")
    try:
        content = await _read_bounded(chunks, _declared_length(upstream_headers), limit)
        outcome = _buffered_outcome(status, content)
        if on_answer_start is not None and status < 400:
            on_answer_start()  # before on_finish: an answer's start never comes after its end
    except errors as exc:
        outcome = Outcome(status=502, error=str(exc))
        raise _upstream_error("while answering", exc) from exc
    except AnswerTooLarge as exc:
        outcome = Outcome(status=502, error=str(exc))
        raise ApiError(502, f"The upstream server's answer is larger than the {limit} bytes this gateway "
                            "relays unstreamed; ask for `stream: true` or for less.", type=SERVER,
                       code="upstream_answer_too_large") from None
    finally:
        on_finish(outcome, close)
    return _buffered_response(content, status, upstream_headers, extra_headers)


class AnswerTooLarge(Exception):
    """A pod's unstreamed answer past the limit: it is not read further, and its connection is closed
    when the answer is (an unread aiohttp or httpx response is not put back in the pool)."""


def _declared_length(headers: Iterable[tuple[str, str]]) -> int | None:
    for name, value in headers:
        if name.lower() == "content-length" and value.strip().isdigit():
            return int(value)
    return None


async def _read_bounded(chunks: AsyncIterator[bytes], declared: int | None, limit: int | None) -> bytes:
    if limit is None:
        return b"".join([chunk async for chunk in chunks])
    if declared is not None and declared > limit:
        raise AnswerTooLarge(f"upstream answer of {declared} bytes declared, limit {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(f"upstream answer larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _buffered_outcome(status: int, content: bytes) -> Outcome:
    stats = stats_from_body(content) if status < 400 else None
    return Outcome(status=status, stats=stats, completed=True, served_slot=_served_slot(content))


def _buffered_response(
    content: bytes, status: int, headers: Iterable[tuple[str, str]], extra: Mapping[str, str] | None
) -> Response:
    # A non-streaming llama-server answer sends its headers when the whole answer is ready. Reading it
    # whole decodes any content-encoding (we ask for identity anyway), so that header must go.
    relayed = response_headers(headers)
    relayed.pop("content-encoding", None)
    response = Response(content, status_code=status, headers=relayed)
    response.headers.update(extra or {})
    return response


def _served_slot(content: bytes) -> int | None:
    # llama-server's native answers carry `id_slot`; only used when the decision left the slot open.
    marker = content.find(b'"id_slot":')
    if marker < 0:
        return None
    digits = content[marker + 10 : marker + 16].split(b",")[0].split(b"}")[0].strip()
    return int(digits) if digits.lstrip(b"-").isdigit() else None

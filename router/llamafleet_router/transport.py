"""Bounds on a request's head (request line and headers) before the app, and so the key check, runs:
its size and the time a client takes to send it.

The gateway runs uvicorn's httptools protocol (the fastest it has). As shipped, that protocol buffers a
head of any size (a 64 MiB header was accepted, and forwarded as the `accept` the pod receives) and
waits for it forever (a client sending a byte now and then holds a connection and its buffer for as
long as it likes: uvicorn's keep-alive timeout starts only after a response, and any byte stops it).
`BoundedHttpTools` adds both bounds:

- size: the bytes of an unfinished head are counted as they arrive, so a head past `max_bytes` is
  refused (431, connection closed) with at most one read more than the limit buffered; a head that
  completes within one read is measured exactly when it is parsed, before any app runs;
- time: from the connection, or the end of the previous response on a kept-alive connection, the whole
  head must arrive within `timeout_s`, else 408 and the connection is closed (closed without an answer
  when nothing of a head came, or when the body of a request answered early still trickles in). An
  idle kept-alive connection is thus closed after `timeout_s` at the latest, whatever uvicorn's own
  keep-alive timeout (5 s by default, which closes it first).

The body's own time limit is the app's (`api.parse.read_body`): it answers an OpenAI-shaped 408 there.
Each response's head goes out with its first body bytes, in one write (`held_head.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from llamafleet_router.errors import error_body
from llamafleet_router.held_head import HeldHead
from llamafleet_router.settings import RouterSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeadBounds:
    max_bytes: int = 32 * 1024
    timeout_s: float = 10.0

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> HeadBounds:
        return cls(settings.max_header_bytes, settings.header_timeout_s)


def bounded_protocol(bounds: HeadBounds) -> type[asyncio.Protocol]:
    """The uvicorn `http` protocol class enforcing `bounds` (`uvicorn.Config(http=...)`)."""
    return type("BoundedHttpTools", (BoundedHttpTools,), {"bounds": bounds})


def uvicorn_options(settings: RouterSettings) -> dict[str, Any]:
    """What `uvicorn.Config` needs for the settings' transport bounds."""
    return {"http": bounded_protocol(HeadBounds.from_settings(settings))}


class BoundedHttpTools(HttpToolsProtocol):  # type: ignore[misc]
    bounds: ClassVar[HeadBounds] = HeadBounds()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = True  # the next bytes are (part of) a request's head
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # Counted only when the read starts in a head: the rest of a read that finished a body may
        # begin the next head, whose size is then measured once it is parsed.
        counted = self._head_open
        if counted:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or (counted and self._head_open and self._head_bytes > self.bounds.max_bytes):
            self._refuse(431, f"The request's headers are larger than the {self.bounds.max_bytes} bytes "
                              "this gateway accepts.", "request_header_fields_too_large")

    def on_message_begin(self) -> None:
        if not self._refused:
            super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._head_open = False
        self._disarm()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.bounds.max_bytes:
            self._refused = True  # answered by data_received once the parser returns
            return
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle and self.cycle is not None:  # a new request's response (held_head.py)
            # uvicorn's cycle uses write, close and is_closing; HeldHead passes anything else through
            self.cycle.transport = cast(asyncio.Transport, HeldHead(self.transport, self.loop))

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._head_open, self._head_bytes = True, 0

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's head is in already: it starts now
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            # Also when the body is still arriving (answered early: 401, 413): it may not trickle on.
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.bounds.timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        answering = not self._head_open and self.cycle is not None and not self.cycle.response_complete
        if answering or self._refused or self.transport.is_closing():
            return
        if self._head_open and self._head_bytes > 0:
            self._refuse(408, f"The request's headers did not arrive within {self.bounds.timeout_s:g} s.",
                         "request_timeout")
        else:  # idle, or the body of a request answered already: nothing to answer, just close
            self._refused = True
            self.transport.close()

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer `status` with an OpenAI-shaped error and close: the rest of the connection's bytes
        cannot be parsed safely any more."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head while the previous answer is still going out: an answer now would land
            # inside that one. Closing ends both (a client pipelining such heads only hurts itself).
            self.transport.close()
            return
        log.info("request head refused", extra={"status": status, "code": code, "client": self.client,
                                                "head_bytes": self._head_bytes})
        body = json.dumps(error_body(message, code=code)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()

"""The RESP wire: packing a command, and one pipelined socket that hands each reply to its waiter.

Shared by the index's client (`resp.py`) and its Sentinel lookups (`sentinel.py`): a connection is a
plain asyncio protocol with a FIFO of waiters (RESP answers in command order), replies parsed by hiredis.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis


def pack(args: Sequence[Any]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = b"%d" % arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise TypeError(f"cannot send {type(arg).__name__} to Redis")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Connection(asyncio.Protocol):
    """One socket: writes commands, parses replies, hands each to the oldest waiter.

    With `timeout_s`, a command not answered within it closes the connection, failing every waiter
    with TimeoutError: replies come in command order, so the oldest command is the one to watch, and
    one timer does it for all of them (an `asyncio.timeout` per command cost two timer handles and
    ~5 us each; a request sends four commands). The timer is armed at the oldest deadline and, when
    it fires, closes or moves on to the oldest command then waiting."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self._reader = hiredis.Reader()
        self.waiters: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.timeout_s = timeout_s
        self._deadlines: deque[float] = deque()  # one per waiter, with `timeout_s`
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass `asyncio.Transport`.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.close(ConnectionError(f"redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not self.waiters:  # a reply nobody asked for: the stream cannot be trusted
                self.close(ConnectionError("redis sent an unexpected reply"))
                return
            waiter = self.waiters.popleft()
            if self._deadlines:
                self._deadlines.popleft()
            if not waiter.done():  # done: its caller was cancelled, the reply is dropped
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"redis connection lost: {exc}" if exc else "redis connection closed"))

    def send(self, data: bytes) -> asyncio.Future[Any]:
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            self.closed = True  # whatever happened, the next command dials a new connection
            raise ConnectionError("redis connection closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self.waiters.append(waiter)
        if self.timeout_s is not None:
            self._deadlines.append(loop.time() + self.timeout_s)
            if self._watchdog is None:
                self._watchdog = loop.call_at(self._deadlines[0], self._watch)
        transport.write(data)
        return waiter

    def _watch(self) -> None:
        self._watchdog = None
        if not self._deadlines or self.closed:
            return
        loop = asyncio.get_running_loop()
        if self._deadlines[0] <= loop.time():
            self.close(TimeoutError("redis did not answer in time"))
            return
        self._watchdog = loop.call_at(self._deadlines[0], self._watch)

    def close(self, exc: Exception) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._deadlines.clear()
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

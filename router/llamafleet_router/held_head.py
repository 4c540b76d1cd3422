"""A response's head goes out in one write with the first bytes of its body.

uvicorn writes a response's status line and headers as soon as the app sends `http.response.start`,
and each body message in a write of its own. On loopback and in a VM each write is a syscall that also
wakes the reader: timed inside the gateway at one stream, the head's write alone took 0.3 ms of a
streamed answer's time to first token, spent before the first event could go. Every answer of the
gateway sends its first body bytes in the same step of its task as the head (a relayed stream already
holds its first event; a buffered answer has its whole body), so holding the head until the end of
that step costs nothing and saves the write.

`HeldHead` is the transport a response cycle writes through: it holds the cycle's first write and
puts it in front of the next one made before the loop runs its next callback; if none comes (an app
that waits before its first body bytes), the head goes out by itself then. Everything else goes
straight to the connection's transport, in order.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeldHead:
    """Wraps one response cycle's transport (`write`, `close`, `is_closing`; the rest passes through)."""

    __slots__ = ("_first", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send the held head now (the end of the step that wrote it, or a close)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

"""A slow loopback link in front of an agent, which goes down with it: a transfer a scenario can cut.

Killing an agent process alone cannot cut a transfer of the tiny model's snapshots (~600 KB): the agent
writes the whole file into its socket at once, the kernel accepts all of it (the send buffer grows to
~1 MB on loopback), and the kernel still delivers it after the process died. What a puller sees as a
transfer cut half-way is the source POD going away (evicted, its node lost): its network goes with its
processes, and the connection is reset with bytes still on the way.

`SlowLink` plays that network. It listens on a port of its own, relays to the agent's port, and relays
the agent's answers at `rate` bytes per second, so a transfer of a few hundred KB is under way for
about a second. It counts the bytes of snapshot files (`GET .../file`) it relayed (`file_bytes`).
`cut()` resets every connection through it at once (RST, nothing more delivered): done together with
the agent's SIGKILL, the puller holds exactly the part that crossed before.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType

HOST = "127.0.0.1"
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST and drops unsent bytes


class SlowLink:
    def __init__(self, upstream_port: int, *, rate: int = 500_000, chunk: int = 8192) -> None:
        self._upstream = upstream_port
        self._rate = rate
        self._chunk = chunk
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.down = False
        self.file_requests = 0  # requests for a snapshot file seen through the link
        self.file_bytes = 0  # bytes relayed back after the latest of them (headers included)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{HOST}:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> SlowLink:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut(self) -> None:
        """The link goes down: every connection through it is reset, now and from now on."""
        self.down = True
        for writer in list(self._writers):
            with contextlib.suppress(OSError):
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_w: asyncio.StreamWriter | None = None
        try:
            if self.down:
                return
            up_r, up_w = await asyncio.open_connection(HOST, self._upstream)
            self._writers |= {client_w, up_w}
            asked = [False]  # the latest request on this connection asked for a snapshot file
            up = asyncio.create_task(self._requests(client_r, up_w, asked))
            try:
                await self._answers(up_r, client_w, asked)
            finally:
                up.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await up
        except OSError:
            pass  # the agent is gone: the client's connection is closed below
        finally:
            for writer in (client_w, up_w):
                if writer is not None:
                    self._writers.discard(writer)
                    writer.close()
            self._tasks.discard(task)

    async def _requests(self, client_r: asyncio.StreamReader, up_w: asyncio.StreamWriter,
                        asked: list[bool]) -> None:
        while data := await client_r.read(65536):
            asked[0] = b"/file HTTP/1." in data
            if asked[0]:
                self.file_requests += 1
                self.file_bytes = 0
            up_w.write(data)
            await up_w.drain()

    async def _answers(self, up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                       asked: list[bool]) -> None:
        while not self.down and (data := await up_r.read(self._chunk)):
            client_w.write(data)
            await client_w.drain()
            if asked[0]:
                self.file_bytes += len(data)
            await asyncio.sleep(len(data) / self._rate)

"""One worker process of `llamafleet router --workers N`: `python -m llamafleet_router.worker`, started
by the supervisor (`supervisor/`), never by hand.

It reads its `WorkerSpec` on stdin, binds its own SO_REUSEPORT socket on the shared client port, and
runs the ordinary gateway (`cli.run`) on it, with its metrics on the loopback socket it inherited.

Stdin stays open as a lifeline: when it ends, the supervisor is gone (even killed), and the worker
stops as on SIGTERM, so that no worker outlives its supervisor holding the port.

SIGTERM ends the worker with exit code 0, after the gateway's own cleanup: uvicorn raises the signal
again once its graceful shutdown is done, and here it raises KeyboardInterrupt (as SIGINT does)
instead of killing the process before the index and its clients are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

from llamafleet_router.cli import loop_factory, run
from llamafleet_router.logs import configure_logging
from llamafleet_router.supervisor.sockets import shared_port_socket
from llamafleet_router.supervisor.spec import WorkerSpec, read_spec


async def stop_when_orphaned() -> None:
    """SIGTERM to this process once stdin, the supervisor's end of the lifeline, is closed."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()  # the supervisor writes nothing more: this returns at its end
    os.kill(os.getpid(), signal.SIGTERM)


async def serve(spec: WorkerSpec, client: socket.socket, metrics: socket.socket) -> None:
    lifeline = asyncio.create_task(stop_when_orphaned(), name="lifeline")
    try:
        await run(spec.settings, client_socket=client, metrics_socket=metrics)
    finally:
        lifeline.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lifeline


def main() -> int:
    spec = read_spec(sys.stdin.buffer)
    configure_logging(spec.settings.log_level, fields={"worker": spec.index})
    metrics = socket.socket(fileno=spec.metrics_fd)
    client = shared_port_socket(spec.settings.host, spec.settings.port)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(spec, client, metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Starting, watching, restarting and stopping the worker processes of one gateway pod.

- A worker that exits without being asked to is started again, after a delay that doubles with each
  exit in a row that came before the worker had run `STABLE_S` (0.5 s, 1 s, 2 s ... 30 s): a crash
  loop costs little, a rare crash is repaired within a second.
- A worker that exits `max_start_failures` times in a row without ever answering (its app never
  started: a pipeline file that does not load, say) fails the pod: the supervisor stops the other
  workers and exits 1, so that a broken configuration shows as a crash loop with its error in the
  log instead of a pod that restarts workers forever.
- `stop()` (SIGTERM, SIGINT) sends SIGTERM to every worker and waits for their graceful shutdown (the
  client server's 30 s, then the drain of after-response work); what is still running after
  `KILL_AFTER_S` is killed. Always SIGTERM, even for SIGINT: Ctrl-C in a terminal reaches the workers
  too, and a second SIGINT would make uvicorn drop the open streams at once.

A worker counts as ready once its private metrics port answers: that port opens only after its client
server has started (`metrics_port.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from llamafleet_router.settings import RouterSettings
from llamafleet_router.supervisor.front import WorkerAddress
from llamafleet_router.supervisor.metrics import SupervisorMetrics
from llamafleet_router.supervisor.sockets import loopback_socket, port_of
from llamafleet_router.supervisor.spec import WorkerSpec, encode

log = logging.getLogger(__name__)

#: The worker's program, named rather than imported: the worker module sits above the CLI.
WORKER_COMMAND = (sys.executable, "-m", "llamafleet_router.worker")
#: A worker that ran this long before it exited is restarted after the shortest delay.
STABLE_S = 60.0
#: The workers' own graceful shutdown (30 s) and drain (10 s), with room; the chart's grace is 45 s.
KILL_AFTER_S = 44.0
MAX_START_FAILURES = 5


def restart_delay_s(quick_exits: int, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Seconds before a restart, after `quick_exits` exits in a row (this one included) that each came
    less than STABLE_S after their start."""
    return min(cap_s, base_s * 2.0 ** max(0, quick_exits - 1))


@dataclass
class Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    metrics_port: int | None = None
    ready: bool = False
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # once, by any incarnation

    def address(self) -> WorkerAddress:
        if self.process is None or self.process.returncode is not None:
            return WorkerAddress(str(self.index), None, None)
        return WorkerAddress(str(self.index), self.process.pid, self.metrics_port)


class Supervisor:
    def __init__(
        self, settings: RouterSettings, metrics: SupervisorMetrics, http: httpx.AsyncClient, *,
        command: Sequence[str] = WORKER_COMMAND, max_start_failures: int = MAX_START_FAILURES,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.http = http
        self.command = tuple(command)
        self.max_start_failures = max_start_failures
        self.workers = [Worker(i) for i in range(settings.workers)]
        self.stopping = asyncio.Event()
        self.all_answered = asyncio.Event()
        self.failure: str | None = None

    def addresses(self) -> list[WorkerAddress]:
        return [w.address() for w in self.workers]

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping the workers", extra={"workers": len(self.workers)})
        self.stopping.set()
        for worker in self.workers:
            _signal(worker, signal.SIGTERM)

    async def run(self) -> int:
        """Until stopped, and every worker has exited: 0, or 1 when the workers failed to start."""
        keepers = [asyncio.create_task(self._keep(w), name=f"worker-{w.index}") for w in self.workers]
        await self.stopping.wait()
        try:
            async with asyncio.timeout(KILL_AFTER_S):
                await asyncio.gather(*keepers)
        except TimeoutError:
            for worker in self.workers:
                if worker.address().pid is not None:
                    log.error("worker did not stop in time: killing it", extra={"worker": worker.index})
                    _signal(worker, signal.SIGKILL)
            await asyncio.gather(*keepers)
        return 1 if self.failure else 0

    def _fail(self, why: str) -> None:
        log.error("the workers cannot start: stopping the gateway", extra={"reason": why})
        self.failure = why
        self.stop()

    async def _keep(self, worker: Worker) -> None:
        try:
            await self._keep_running(worker)
        except Exception as exc:  # a bug or an unusable command: nothing to restart
            log.exception("supervising a worker failed", extra={"worker": worker.index})
            self._fail(f"worker {worker.index}: {type(exc).__name__}: {exc}")

    async def _keep_running(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        failed_starts = quick_exits = 0
        while not self.stopping.is_set():
            started = loop.time()
            process = await self._spawn(worker)
            watch = asyncio.create_task(self._until_ready(worker), name=f"worker-{worker.index}-ready")
            code = await process.wait()
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            was_ready, worker.ready = worker.ready, False
            self.metrics.ready.labels(str(worker.index)).set(0)
            if process.stdin is not None:
                process.stdin.close()
            facts = {"worker": worker.index, "pid": process.pid, "exit_code": code}
            if self.stopping.is_set():
                log.info("worker stopped", extra=facts)
                return
            failed_starts = 0 if was_ready else failed_starts + 1
            quick_exits = quick_exits + 1 if loop.time() - started < STABLE_S else 1
            if failed_starts >= self.max_start_failures:
                self._fail(f"worker {worker.index} exited {failed_starts} times before it answered "
                           f"(last exit code {code}); see its log lines above")
                return
            delay = restart_delay_s(quick_exits)
            log.error("worker exited unexpectedly: restarting it",
                      extra={**facts, "was_ready": was_ready, "restart_in_s": delay})
            self.metrics.restarts.labels(str(worker.index)).inc()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.stopping.wait()

    async def _spawn(self, worker: Worker) -> asyncio.subprocess.Process:
        sock = loopback_socket()
        try:
            spec = WorkerSpec(worker.index, self.settings, sock.fileno())
            process = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, pass_fds=(sock.fileno(),))
            worker.metrics_port = port_of(sock)
        finally:
            sock.close()  # the worker's copy is the only one: a dead worker's port refuses at once
        worker.process = process
        assert process.stdin is not None
        # The pipe stays open: it is the worker's lifeline (spec.py). A worker that died at once
        # closed it; its exit code says why.
        with contextlib.suppress(ConnectionError):
            process.stdin.write(encode(spec))
            await process.stdin.drain()
        if self.stopping.is_set():  # stop() came while it was starting
            _signal(worker, signal.SIGTERM)
        log.info("worker started", extra={"worker": worker.index, "pid": process.pid})
        return process

    async def _until_ready(self, worker: Worker, every_s: float = 0.1) -> None:
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        while True:  # the worker has no start event to wait for: its port refuses until it serves
            try:
                await self.http.get(url, timeout=2.0)
                break
            except httpx.HTTPError:
                await asyncio.sleep(every_s)
        worker.ready = True
        worker.answered.set()
        self.metrics.ready.labels(str(worker.index)).set(1)
        log.info("worker ready", extra={"worker": worker.index, "pid": worker.address().pid})
        if all(w.answered.is_set() for w in self.workers):
            self.all_answered.set()


def _signal(worker: Worker, sig: signal.Signals) -> None:
    if worker.process is not None and worker.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(sig)

"""Work off the request path: tracked tasks, and the index health watcher (degraded mode).

Every task the app spawns is kept in a set until it finishes, so none is garbage collected mid-flight
and shutdown can wait for them (`drain`). Their exceptions are logged, never lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from llamafleet_core.index.base import PrefixIndex
from llamafleet_router.metrics import RouterMetrics

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, swallowing its own cancellation and failure but never
    a cancellation of the caller: `with suppress(CancelledError): await task` swallows both, and a
    caller whose cancel is swallowed goes on running (retrying a request, say) while whoever cancelled
    it waits, as a test teardown's loop shutdown once did."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # the task's own failure while ending: logged where it was spawned, if at all
        return


class TaskSet:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception(), extra={"task": task.get_name()})

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, limit_s: float | None = None) -> None:
        """Wait for every task (including ones spawned meanwhile); cancel what is left after `limit_s`."""
        loop = asyncio.get_running_loop()
        deadline = None if limit_s is None else loop.time() + limit_s
        while self._tasks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            await asyncio.wait(set(self._tasks), timeout=remaining)
        if self._tasks:
            log.warning("cancelling background tasks still running at shutdown",
                        extra={"tasks": sorted(t.get_name() for t in self._tasks)})
        for task in list(self._tasks):
            await cancel_and_wait(task)


class IndexHealth:
    """Whether the prefix index answers. Anyone who sees it fail calls `mark_degraded`; the watcher
    pings it every interval and flips back when it answers again. Routing itself never waits on this:
    the scheduler falls back on its own when a lookup fails."""

    def __init__(self, index: PrefixIndex, metrics: RouterMetrics, interval: float) -> None:
        self._index = index
        self._metrics = metrics
        self._interval = interval
        self.degraded = False
        # Called when the index answers again after an outage, or answers as a new instance (a Redis
        # restarted empty between two pings): it lost every entry, and whoever can rebuild some (the
        # snapshot resync) registers here.
        self.on_recovered: list[Callable[[], None]] = []
        self._instance: str | None = None

    def mark_degraded(self, reason: str = "") -> None:
        if not self.degraded:
            log.warning("prefix index unavailable: degraded routing", extra={"reason": reason})
        self.degraded = True
        self._metrics.index_degraded.set(1)

    def mark_ok(self) -> None:
        if self.degraded:
            log.info("prefix index back: prefix-aware routing resumed")
            for hook in self.on_recovered:
                hook()
        self.degraded = False
        self._metrics.index_degraded.set(0)

    async def check(self) -> bool:
        try:
            ok = await self._index.ping()
            instance = await self._index.instance() if ok else None
        except Exception as exc:  # ping must not raise, but a broken one must not kill the watcher
            ok, instance = False, None
            reason = repr(exc)
        else:
            reason = "ping failed"
        if ok:
            self._seen(instance)
            self.mark_ok()
        else:
            self.mark_degraded(reason)
        return ok

    def _seen(self, instance: str | None) -> None:
        """A new instance while not degraded: the outage fell between two pings; act as after one."""
        known, self._instance = self._instance, instance
        if known is not None and instance != known and not self.degraded:
            log.warning("prefix index restarted empty: recording what can be recorded again")
            for hook in self.on_recovered:
                hook()

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._interval)

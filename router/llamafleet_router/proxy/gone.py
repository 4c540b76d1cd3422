"""`GoneSignal`: discovery's word that a pod hung or went away, to the requests waiting on it.

A request waiting for a pod's first byte, or relaying its stream, must stop at once when discovery marks
the pod down. Racing its work against `asyncio.Event.wait()` would cost every request two tasks and
an `asyncio.wait` (and every stream one more task) for an event that almost never fires.
Here a waiter registers a callback instead; `set()` calls each one, which cancels the waiting task, and
the waiter tells that cancel from any other by its own flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class PodUnreachable(Exception):
    """The pod refused the connection, did not accept it in time, or was marked down (hung or gone)
    while the request waited for it; nothing reached the client, so it may go to another pod."""


class GoneSignal:
    """Set once, by discovery, when its pod goes down; wakes every registered waiter."""

    def __init__(self) -> None:
        self._set = False
        self._callbacks: set[Callable[[], None]] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = self._callbacks, set()
        for callback in callbacks:
            callback()

    def add(self, callback: Callable[[], None]) -> None:
        """Call `callback` on `set()` (at once when already set)."""
        if self._set:
            callback()
        else:
            self._callbacks.add(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        self._callbacks.discard(callback)


class CancelOnGone:
    """Cancels the current task when `signal` is set, and remembers that it did (`fired`), so the task
    can tell discovery's cancel from its caller's. Use as a context manager around the waiting."""

    def __init__(self, signal: GoneSignal) -> None:
        self.signal = signal
        self.fired = False
        self._task: asyncio.Task[object] | None = None

    def _fire(self) -> None:
        if self._task is not None and not self.fired:
            self.fired = True
            self._task.cancel()

    def __enter__(self) -> CancelOnGone:
        self._task = asyncio.current_task()
        self.signal.add(self._fire)
        return self

    def __exit__(self, *exc: object) -> None:
        self.signal.discard(self._fire)

    def ours(self) -> bool:
        """Inside `except CancelledError`: True when the cancel was this signal's alone (then it is
        taken back, and the caller goes on); False when the task's caller cancelled it too."""
        if not self.fired or self._task is None:
            return False
        return self._task.uncancel() == 0


async def unless_gone(signal: GoneSignal | None, work: Awaitable[T]) -> T:
    """`await work`, unless `signal` is set first: then `work` is cancelled and `PodUnreachable` raised,
    so the request goes to another pod. A cancel of the caller meanwhile propagates as a cancel."""
    if signal is None:
        return await work
    if signal.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise PodUnreachable("the pod was marked down (hung or gone) before it answered")
    watch = CancelOnGone(signal)
    with watch:
        try:
            return await work
        except asyncio.CancelledError:
            if watch.ours():
                raise PodUnreachable("the pod was marked down (hung or gone) before it answered") from None
            raise

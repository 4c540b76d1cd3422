"""Cancelling work never swallows the canceller's own cancellation.

`task.cancel(); with suppress(CancelledError): await task` also swallows a cancel of the task doing the
waiting, which then runs on (a request went on to retry on another pod) while whoever cancelled it
waits for it: the shape of a teardown that once hung. `cancel_and_wait` and `unless_gone` must let it
through.
"""

from __future__ import annotations

import asyncio

import pytest

from llamafleet_router.background import TaskSet, cancel_and_wait
from llamafleet_router.proxy.gone import GoneSignal, PodUnreachable, unless_gone


class SlowToCancel:
    """Work whose cancellation takes a while (closing a connection, say): its cleanup runs until the
    test lets it end. The test waits for each step of it, never for a time."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cleaning = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self) -> None:
        try:
            self.started.set()
            await asyncio.sleep(60)
        finally:
            self.cleaning.set()
            await self.release.wait()


async def _slow_to_cancel(cleanup_s: float = 0.2) -> None:
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.sleep(cleanup_s)


async def test_cancel_and_wait_propagates_a_cancel_of_the_waiter_when_the_task_ends_slowly() -> None:
    slow = SlowToCancel()
    work = asyncio.create_task(slow.run())
    await slow.started.wait()
    waiter = asyncio.create_task(cancel_and_wait(work))
    await slow.cleaning.wait()  # the waiter cancelled the work and now awaits its slow cleanup
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert waiter.cancelled()


async def test_cancel_and_wait_swallows_only_the_tasks_own_end() -> None:
    """Cancelling a task, or a task that fails while ending, is what the caller asked for: no error."""
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise RuntimeError("cleanup failed")

    for coro in (_slow_to_cancel(0.0), fails_on_cancel()):
        task = asyncio.create_task(coro)
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        assert task.done()


async def test_unless_gone_raises_the_callers_cancel_not_pod_unreachable_when_cancelled_meanwhile() -> None:
    """The pod is marked down, so the work is being cancelled; the client leaves meanwhile. The request
    must end cancelled: PodUnreachable would send it on to another pod for a client that is gone."""
    gone, slow = GoneSignal(), SlowToCancel()

    async def request() -> None:
        await unless_gone(gone, slow.run())

    task = asyncio.create_task(request())
    await slow.started.wait()
    gone.set()
    await slow.cleaning.wait()  # unless_gone now waits for the work's slow cancellation
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slow.release.set()


async def test_unless_gone_raises_pod_unreachable_when_the_pod_is_marked_down() -> None:
    gone = GoneSignal()
    gone.set()
    with pytest.raises(PodUnreachable):
        await unless_gone(gone, _slow_to_cancel(0.0))


async def test_unless_gone_moves_a_waiting_request_and_leaves_nothing_behind() -> None:
    """Marked down while the work waits: PodUnreachable at once (no task raced against an event), and
    neither a finished wait nor a moved one leaves a callback on the pod's signal."""
    gone = GoneSignal()
    assert await unless_gone(gone, asyncio.sleep(0, result="answer")) == "answer"
    assert not gone._callbacks

    waiting = asyncio.Event()

    async def wait_for_the_pod() -> None:
        waiting.set()  # unless_gone registers on the signal before it awaits the work
        await asyncio.sleep(60)

    async def request() -> None:
        await unless_gone(gone, wait_for_the_pod())

    task = asyncio.create_task(request())
    await waiting.wait()
    assert len(gone._callbacks) == 1
    gone.set()
    with pytest.raises(PodUnreachable):
        await task
    assert not gone._callbacks and not task.cancelled()


async def test_drain_cancels_what_is_left_after_its_limit() -> None:
    tasks = TaskSet()
    slow = tasks.spawn(_slow_to_cancel(0.0), name="slow")
    await tasks.drain(0.05)
    assert slow.cancelled() and len(tasks) == 0


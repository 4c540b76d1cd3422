"""Stopping a local fleet in bounded time: each step has a time limit, and every step runs whatever the
ones before it did.

Why: a SIGTERM to `up` must end every process it started within seconds, but each step waits on
something that may never answer. The in-process gateway's shutdown waits for its open connections, its
background tasks (restores, copies and primes against pods that were killed and restarted) and its
lifespan; a pod's agent may sit in a long request. A run was seen hanging in the gateway's shutdown
after its pods had been restarted, with the redis-server, stopped only after the gateway, still
running. So a step that fails or runs out of time is reported and the next one runs anyway: pods and
redis-server are always stopped, and a last step sends SIGKILL to whatever still runs.

The whole stop fits in `up`'s 10 seconds: with every step cut off at its limit (seconds, below) and
given `CANCELLED_S` to unwind, it takes 2.7 + 4.7 + 3 x 0.5 = 8.9 s, plus `CANCELLED_S` for the
supervisor (`LocalFleet.run_until`) and `cli.LEFTOVER_S` for what is left on the event loop: 9.6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llamafleet_local.redis_server import RedisServer
    from llamafleet_local.up.pods import LocalPod

GATEWAY_S = 2.5  # uvicorn's own stop gets `gateway.SHUTDOWN_S` of it, then it is forced out
POD_GRACE_S = 1.5  # SIGTERM to SIGKILL, for each agent and then its llama-server (idle, both exit at once)
POD_KILL_S = 0.5  # after SIGKILL, until the process is reaped
PODS_S = 2 * (POD_GRACE_S + POD_KILL_S) + 0.5
SMALL_S = 0.3  # the index client, redis-server (killed), the HTTP client
CANCELLED_S = 0.2  # a step cut off at its limit: how long its cancel may take to unwind


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[], Awaitable[Any]]
    limit_s: float


async def bounded(aw: Awaitable[Any], limit_s: float) -> None:
    """Await `aw` for at most `limit_s` seconds, then cancel it and give it `CANCELLED_S` to unwind.

    Not `asyncio.wait_for`: after its timeout it waits for the cancelled awaitable to end, however long
    that takes, and code that swallows a cancel (`suppress(CancelledError)` around an await) then keeps
    it waiting. Raises `TimeoutError` when cut off, and the awaitable's own error when it failed."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=CANCELLED_S)
        if not task.done():
            task.add_done_callback(_quiet)  # still unwinding: its outcome must not be logged as lost
        raise TimeoutError(f"did not finish within {limit_s:.1f}s")
    task.result()


def _quiet(task: asyncio.Future[Any]) -> None:
    with contextlib.suppress(BaseException):
        task.result()


async def run_steps(steps: Sequence[Step], say: Callable[[str], None]) -> list[str]:
    """Run every step in order, each bounded; returns (and says) what failed or ran out of time."""
    problems = []
    for step in steps:
        try:
            await bounded(step.run(), step.limit_s)
        except Exception as exc:  # TimeoutError included: the next step runs in any case
            problems.append(f"{step.name}: {type(exc).__name__}: {exc}")
            say(f"stopping {step.name}: {type(exc).__name__}: {exc}; going on")
    return problems


async def stop_pods(pods: Sequence[LocalPod]) -> None:
    """Every pod at once, each its agent first (it calls its llama-server), then its llama-server."""
    await asyncio.gather(*(pod.stop(POD_GRACE_S, POD_KILL_S) for pod in pods))


async def stop_redis(redis: RedisServer | None) -> None:
    if redis is not None:
        redis.stop()  # a SIGKILL and a reap: nothing to wait for, so not worth a thread


def kill_left(pods: Sequence[LocalPod]) -> None:
    """SIGKILL to every process still running: what a step cut off at its limit left behind."""
    for pod in pods:
        for child in pod.children:
            child.kill()

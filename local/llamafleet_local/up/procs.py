"""Child processes of `llamafleet up`: each in its own process group, its output in a log file.

Why a process group per child: a signal to the group also reaches anything the child spawned, and
Ctrl-C in the terminal reaches only `up`, which then stops the children in order (gateway first, so no
request is sent to a pod being stopped). On Linux every child `up` starts (llama-servers, agents, the
embedded redis-server) also gets `PR_SET_PDEATHSIG` from `dying_with_parent`, so even a `kill -9` of
`up` leaves none behind. Children are started from the event loop's thread: the death signal fires
when the *thread* that forked them exits, so never start one from `asyncio.to_thread` or an executor
(a worker thread may end long before `up` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LOG_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def dying_with_parent() -> Callable[[], None]:
    """A `preexec_fn`: the child gets a session of its own and SIGTERM when the calling thread ends.

    prctl is looked up here, in the parent: the child runs between fork and exec, where loading
    anything could deadlock on a lock another thread of the parent held at the fork. A parent that died
    before the child's prctl would never send the signal, so the child then exits at once (its parent
    has changed: it was reparented)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        os.setsid()
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:
                os._exit(1)

    return preexec


class ChildFailed(RuntimeError):
    """A child exited (or never became healthy); the message carries the tail of its log."""


@dataclass
class Child:
    """One supervised process: `argv` exactly as run, `log` where its stdout and stderr go."""

    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"--- {stamp} starting: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, preexec_fn=dying_with_parent(),
            )
        self.started_at = time.monotonic()

    def failure(self, what: str) -> ChildFailed:
        return ChildFailed(f"{self.name} {what}; log {self.log}:\n{log_tail(self.log)}")

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)  # its own session: the group id is its pid

    async def stop(self, grace: float = 10.0, kill_wait: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL after `grace` seconds, then up to `kill_wait` seconds for the
        kernel to reap it. Safe to call twice."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            if not await _wait_exit(proc, grace):
                self._signal_group(signal.SIGKILL)
                await _wait_exit(proc, kill_wait)
        # Anything left in its group (a grandchild that ignored SIGTERM) goes too.
        self._signal_group(signal.SIGKILL)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL to the group now, without waiting: the last resort of a stop that ran out of time."""
        if self.running:
            self._signal_group(signal.SIGKILL)

    async def wait_http(self, url: str, http: httpx.AsyncClient, timeout: float) -> None:
        """Until `GET url` answers 200; raises ChildFailed if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code
            if code is not None:
                raise self.failure(f"exited with code {code} while starting")
            try:
                if (await http.get(url, timeout=2.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet, or still loading the model
            await asyncio.sleep(0.1)
        raise self.failure(f"did not answer 200 on {url} within {timeout:.0f}s")


async def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        await asyncio.sleep(0.05)
    return proc.poll() is not None


async def stop_all(children: Sequence[Child], grace: float = 10.0) -> None:
    """Stop several children at once (each still gets its own grace period)."""
    await asyncio.gather(*(child.stop(grace) for child in children))

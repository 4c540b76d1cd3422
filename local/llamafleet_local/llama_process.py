"""Start and stop one real llama-server process on a free loopback port.

Used by the test bed and the local runtime. The server runs in its own session (process group) so that
stopping it also ends anything it spawned, and its output goes to a log file whose tail is shown when
it fails to start: a model that does not load must fail loudly, with llama.cpp's own words.

Defaults suit tests on small machines: one thread (`-t 1`), explicit slots (`-np`), which gives every
slot its own KV stream (no `-kvu`), so an idle slot keeps its prefix in place (see measured.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llamafleet_core import http_pool
from llamafleet_local.redis_server import free_port

LOG_TAIL_LINES = 40


class LlamaServerError(RuntimeError):
    """llama-server did not come up; the message carries the tail of its log."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def server_args(
    model: Path, port: int, *, slots: int, ctx: int, threads: int,
    slot_save_path: Path | None, extra_args: Sequence[str] = (),
) -> list[str]:
    """The command-line arguments (without the binary) for one test server (pure)."""
    args = [
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--jinja",
        "-np", str(slots), "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
    ]
    if slot_save_path is not None:
        args += ["--slot-save-path", str(slot_save_path)]
    return args + list(extra_args)


@dataclass
class LlamaServerProcess:
    """One llama-server; `start()` blocks until `GET /health` answers 200."""

    binary: Path
    model: Path
    workdir: Path
    slots: int = 4
    ctx: int | None = None  # default: 20480 tokens per slot (per-slot KV splits -c across slots)
    threads: int = 1
    slot_save_path: Path | None = None
    extra_args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"llama-server-{self.port}.log"

    @property
    def n_ctx(self) -> int:
        return self.ctx if self.ctx is not None else self.slots * 20480

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [str(self.binary), *server_args(
            self.model, self.port, slots=self.slots, ctx=self.n_ctx, threads=self.threads,
            slot_save_path=self.slot_save_path, extra_args=self.extra_args,
        )]

    def start(self, timeout: float = 60.0) -> LlamaServerProcess:
        if self.running:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.slot_save_path is not None:
            self.slot_save_path.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        with http_pool.sync_client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    self.proc = None
                    raise LlamaServerError(
                        f"llama-server exited with code {code} while starting ({self.model.name}); "
                        f"log {self.log_path}:\n{log_tail(self.log_path)}"
                    )
                try:
                    if http.get(self.url + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass  # not listening yet, or still loading
                time.sleep(0.05)
        self.stop()
        raise LlamaServerError(
            f"llama-server did not become healthy within {timeout}s on port {self.port}; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # its own session: the group id is its pid

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; always reaps the process."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL at once: tests use this to simulate a pod dying."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

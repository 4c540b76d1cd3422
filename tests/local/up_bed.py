"""`llamafleet up` as a real subprocess, for the tests that need real signals: start it, wait for its
gateway, read what it started (`state.json`), and check that none of it outlives it.

Every `up` here gets its own `--state-dir` under the test's folder: the default state folder is in the
shared cache, where runs would find each other's snapshots and lock each other out.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.redis_server import free_port

UP = [sys.executable, "-m", "llamafleet_cli.cli", "up"]


def fleet_yaml(binary: Path, *, replicas: int = 2, slots: int = 2, context: int = 4096,
               prefix: str | None = None) -> str:
    """A tiny-dense fleet `t` (pods `t-0`, `t-1`, ...), one thread per pod; `prefix`: a SharedPrefix
    `rules` with that system prompt."""
    text = f"""\
apiVersion: llamafleet.io/v1alpha1
kind: LlamaFleet
metadata: {{name: t}}
spec:
  model: {{name: tiny-dense, file: tiny-dense.gguf, source: {{hostPath: /models}}}}
  image: local
  replicas: {replicas}
  slots: {slots}
  contextPerSlot: {context}
local:
  model: tiny-dense
  threads: 1
  llamaServer: {binary}
"""
    if prefix is not None:
        text += f"""\
---
apiVersion: llamafleet.io/v1alpha1
kind: SharedPrefix
metadata: {{name: rules}}
spec:
  fleetRef: {{name: t}}
  messages: [{{role: system, content: {json.dumps(prefix)}}}]
"""
    return text


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    url: str
    run_dir: Path
    config_path: Path
    stderr: Path

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.run_dir / "state.json").read_text())
        return state

    def pids(self) -> list[int]:
        """Every process it started: each pod's two, and the embedded redis-server."""
        state = self.state()
        return [p["pid"] for p in state["processes"]] + [state["redis"]["pid"]]

    def process(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = next(p for p in self.state()["processes"] if p["name"] == name)
        return found

    def agent_url(self, pod: str) -> str:
        argv = self.process(f"{pod} agent")["argv"]
        return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"

    @property
    def agent_token(self) -> str:
        return (self.run_dir / "agent-token").read_text().strip()

    def wait_url(self, timeout: float) -> str:
        """The line `up` prints on stdout once the fleet is ready (its gateway URL)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"up printed no gateway URL within {timeout}s:\n{self.stderr_tail()}")
        return self.proc.stdout.readline().decode().strip()

    def stderr_tail(self, lines: int = 30) -> str:
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM; SIGKILL if it is still there after `timeout`. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_up(tmp_path: Path, config_path: Path, run: str, *extra: str) -> Up:
    """`llamafleet up -f CONFIG --run-dir tmp/RUN --state-dir tmp/state ...extra` on a free port."""
    port, run_dir = free_port(), tmp_path / run
    stderr = tmp_path / f"{run}.stderr"
    state = [] if "--state-dir" in extra else ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen(
        [*UP, "-f", str(config_path), "--port", str(port), "--run-dir", str(run_dir), *state, *extra],
        stdout=subprocess.PIPE, stderr=stderr.open("wb"),
    )
    return Up(proc, f"http://127.0.0.1:{port}", run_dir, config_path, stderr)


def wait_health(
    http: httpx.Client, url: str, timeout: float, want: int = 200,
) -> tuple[list[int], dict[str, Any]]:
    """Poll /health until it answers `want`; returns every status seen on the way and the last body."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            resp = http.get(url + "/health")
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        seen.append(resp.status_code)
        if resp.status_code == want:
            return seen, resp.json()
        time.sleep(0.05)
    raise AssertionError(f"/health never answered {want} within {timeout}s (saw {sorted(set(seen))})")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but not yet reaped by its parent; it holds nothing.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until none of `pids` runs or `timeout` passed; returns those still running."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmdline = "(gone meanwhile)"
        out.append(f"{pid}: {cmdline}")
    return out


def strays(folder: Path) -> list[str]:
    """Processes whose command line mentions `folder` (the test's folder: every child's names its run
    folder or its state folder: logs, token, snapshots)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmdline and alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found

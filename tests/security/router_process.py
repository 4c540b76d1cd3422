"""A real `llamafleet router` process over the fuzzers' fake pod (served in a thread of this process),
for the checks that need the gateway on its own: its memory (peak RSS from /proc) and the transport
options its command line sets up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llamafleet_local.redis_server import free_port
from llamafleet_router.inprocess import serve
from tests.fuzz.fake_pod import FAKE_FIELDS, Hit, Stream, fake_pod

API_KEY = "router-process-secret-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Pod:
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)


@contextlib.contextmanager
def pod_in_thread() -> Iterator[Pod]:
    """The fake pod on a loopback port, on an event loop of its own in a background thread."""
    pod = Pod()
    ready = threading.Event()
    stop: list[asyncio.Event] = []
    loop: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        loop.append(asyncio.get_running_loop())
        async with serve(fake_pod(pod.received, pod.hits, pod.streams)) as url:
            pod.url = url
            ready.set()
            await stop[0].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the fake pod did not start"
    try:
        yield pod
    finally:
        loop[0].call_soon_threadsafe(stop[0].set)
        thread.join(30)


@dataclass
class RouterProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def status(self, field_name: str) -> int:
        """A `/proc/<pid>/status` figure in KiB (VmRSS, VmHWM: the peak RSS)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        raise KeyError(field_name)


@contextlib.contextmanager
def router_process(pod_url: str, tmp_path: Path, **settings: str) -> Iterator[RouterProcess]:
    """`llamafleet router --pods POD` on a free port (settings as LLAMAFLEET_ROUTER_* variables), once
    its /health says the pod is up; stopped (SIGTERM, then SIGKILL) afterwards. The fake pod's own
    body fields are let through, as in the served gateway."""
    port = free_port()
    env = {**os.environ, "LLAMAFLEET_ROUTER_API_KEYS": f"security:{API_KEY}",
           "LLAMAFLEET_ROUTER_POLL_INTERVAL": "0.2", "LLAMAFLEET_ROUTER_EXTRA_FIELDS": ",".join(FAKE_FIELDS),
           **{f"LLAMAFLEET_ROUTER_{name.upper()}": value for name, value in settings.items()}}
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llamafleet_cli.cli", "router", "--pods", pod_url, "--index", "memory",
             "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"the router exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the router did not get ready: {log.read_text()[-2000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", headers=AUTH, timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield RouterProcess(url, process, log)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

"""`llamafleet router --workers 2` as real processes: a supervisor, two gateway workers on one port, a
real Redis index and a fake pod (served on this test's event loop).

Every wait is for the event itself (a port answering, a pid changing, the process exiting), bounded by
a deadline; none orders events by sleeping.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llamafleet_local.redis_server import free_ports
from llamafleet_router.inprocess import serve
from tests.fuzz.fake_pod import MODEL, fake_pod

T = TypeVar("T")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello to the workers."}],
        "max_tokens": 4}


async def until(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """The first truthy answer of `check`, polled until `timeout` seconds have passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = await check()
        if answer:
            return answer
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


@dataclass
class Gateway:
    process: asyncio.subprocess.Process
    url: str
    metrics_url: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


async def start_gateway(tmp_path: Path, *args: str, **env: str) -> Gateway:
    port, metrics_port = free_ports(2)
    log = tmp_path / f"router-{port}.log"
    variables = {**os.environ, "LLAMAFLEET_ROUTER_POLL_INTERVAL": "0.2",
                 "LLAMAFLEET_ROUTER_METRICS_PORT": str(metrics_port), **env}
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llamafleet_cli.cli", "router", "--host", "127.0.0.1", "--port", str(port),
            *args, env=variables, stdout=out, stderr=asyncio.subprocess.STDOUT)
    return Gateway(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", log)


async def health(http: httpx.AsyncClient, gw: Gateway) -> dict[str, Any] | None:
    """The supervisor's /health when every worker answers healthy, else None."""
    assert gw.process.returncode is None, f"the gateway exited:\n{gw.log_tail()}"
    try:
        resp = await http.get(gw.metrics_url + "/health", timeout=3.0)
    except httpx.HTTPError:
        return None
    body: dict[str, Any] = resp.json()
    return body if resp.status_code == 200 else None


def served_by_worker(metrics_text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "llamafleet_router_requests_total" and s.labels["status"] == "200":
                counts[s.labels["worker"]] += int(s.value)
    return counts


def sample(metrics_text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def chat_on_new_connections(url: str, connections: int, each: int) -> list[int]:
    """`connections` clients (one connection each), `each` requests apiece, all at once."""
    async def one_client() -> list[int]:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return [(await client.post(url + "/v1/chat/completions", json=CHAT)).status_code
                    for _ in range(each)]
    return [code for codes in await asyncio.gather(*(one_client() for _ in range(connections)))
            for code in codes]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not). The process may be reaped between the two looks, or
    while its /proc file is read (the read then fails with ESRCH): that is gone too."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
async def pod_url() -> AsyncIterator[str]:
    async with serve(fake_pod([])) as url:
        yield url


async def reap(gw: Gateway) -> None:
    """Kill the supervisor if a failed test left it running (its workers follow it: the lifeline)."""
    if gw.process.returncode is None:
        gw.process.kill()
        await gw.process.wait()


async def stop(gw: Gateway) -> int:
    if gw.process.returncode is None:
        gw.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        return await gw.process.wait()


@pytest.mark.redis
@pytest.mark.slow
async def test_two_workers_share_the_port_merge_their_metrics_restart_and_stop_cleanly(
    redis_url: str, pod_url: str, tmp_path: Path,
) -> None:
    gw = await start_gateway(tmp_path, "--workers", "2", "--redis", redis_url, "--pods", pod_url,
                             LLAMAFLEET_ROUTER_INDEX_PREFIX=f"w{uuid.uuid4().hex[:8]}")
    try:
        async with httpx.AsyncClient() as http:
            body = await until(lambda: health(http, gw), 60, "both workers healthy")
            pids = {w["worker"]: w["pid"] for w in body["workers"]}
            assert set(pids) == {"0", "1"} and len(set(pids.values())) == 2, body
            assert all(w["health"]["pods_up"] == 1 for w in body["workers"]), body

            # Sixteen connections: the kernel spreads them over both workers' sockets.
            codes = await chat_on_new_connections(gw.url, 16, 3)
            assert codes == [200] * 48
            text = (await http.get(gw.metrics_url + "/metrics")).text
            families = [f.name for f in text_string_to_metric_families(text)]
            assert len(families) == len(set(families)), "a family described twice"
            served = served_by_worker(text)
            assert sum(served.values()) == 48 and served["0"] > 0 and served["1"] > 0, served
            assert sample(text, "llamafleet_router_worker_scrape_failures_total", worker="0") == 0

            # A worker killed: the other serves new connections at once, and it is started again.
            os.kill(pids["0"], signal.SIGKILL)

            async def killed() -> bool:
                return not alive(pids["0"])

            await until(killed, 30, "the killed worker gone")
            assert await chat_on_new_connections(gw.url, 8, 1) == [200] * 8

            async def restarted() -> dict[str, Any] | None:
                found = await health(http, gw)
                if found is None:
                    return None
                now = {w["worker"]: w["pid"] for w in found["workers"]}
                return found if now["0"] not in (None, pids["0"]) and now["1"] == pids["1"] else None

            await until(restarted, 60, "worker 0 restarted and healthy")

            async def seen_ready() -> str | None:  # the supervisor's own poll may come a moment later
                text = (await http.get(gw.metrics_url + "/metrics")).text
                return text if sample(text, "llamafleet_router_worker_ready", worker="0") == 1 else None

            text = await until(seen_ready, 30, "the supervisor sees worker 0 ready again")
            assert sample(text, "llamafleet_router_worker_restarts_total", worker="0") == 1
            assert sample(text, "llamafleet_router_worker_restarts_total", worker="1") == 0
            assert served_by_worker(text)["1"] >= served["1"]  # the other worker's counts went on
            final = await until(lambda: health(http, gw), 30, "healthy after the restart")
            worker_pids = [w["pid"] for w in final["workers"]]

            assert await stop(gw) == 0, gw.log_tail()
            assert not any(alive(pid) for pid in worker_pids), "a worker outlived the supervisor"
            with pytest.raises(httpx.ConnectError):
                await http.get(gw.url + "/health", timeout=2.0)
    finally:
        await reap(gw)


@pytest.mark.redis
@pytest.mark.slow
async def test_workers_that_keep_dying_at_start_fail_the_gateway(
    redis_url: str, pod_url: str, tmp_path: Path,
) -> None:
    """A broken configuration (here a pipeline file that is not there) kills every worker at start:
    the supervisor gives up after a few tries and exits non-zero, and the pod fails visibly."""
    gw = await start_gateway(tmp_path, "--workers", "2", "--redis", redis_url, "--pods", pod_url,
                             "--config", str(tmp_path / "missing-pipeline.yaml"))
    try:
        async with asyncio.timeout(120):
            code = await gw.process.wait()
        assert code == 1, gw.log_tail()
        assert "exited 5 times before it answered" in gw.log_tail()
    finally:
        await reap(gw)


@pytest.mark.redis
@pytest.mark.slow
async def test_no_worker_outlives_a_killed_supervisor(redis_url: str, pod_url: str, tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no time to stop its workers: they notice the end of their stdin
    (the lifeline) and stop on their own, freeing the port."""
    gw = await start_gateway(tmp_path, "--workers", "2", "--redis", redis_url, "--pods", pod_url)
    try:
        async with httpx.AsyncClient() as http:
            body = await until(lambda: health(http, gw), 60, "both workers healthy")
            worker_pids = [w["pid"] for w in body["workers"]]
            gw.process.kill()
            await gw.process.wait()

            async def all_gone() -> bool:
                return not any(alive(pid) for pid in worker_pids)

            await until(all_gone, 60, "the orphaned workers stopped")
            with pytest.raises(httpx.ConnectError):
                await http.get(gw.url + "/health", timeout=2.0)
    finally:
        await reap(gw)

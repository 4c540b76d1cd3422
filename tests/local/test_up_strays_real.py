"""No process of `llamafleet up` outlives it: not after a SIGKILL of `up` itself (each child's death
signal), not after a SIGTERM that comes once a pod was killed and restarted, and not when the gateway
hangs in its shutdown (the bounded stop).

One pod x 2 slots, tiny dense model; the second test adds a SharedPrefix, so the restarted pod is
warmed again before `up` is stopped, as in the run that once hung in the gateway's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from llamafleet_local.up import LocalFleet, UpOptions, load_fleet
from llamafleet_local.up.progress import Reporter
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.local.up_bed import Up, describe, fleet_yaml, start_up, strays, wait_gone, wait_health

pytestmark = [pytest.mark.llama, pytest.mark.redis]

RULES = " ".join(f"Rule {i}: answer briefly and name files by their path." for i in range(40))


def test_sigkill_of_up_leaves_no_process_behind(tmp_path: Path, llama_server_bin: Path,
                                               runs: list[Up]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_yaml(llama_server_bin, replicas=1))
    up = start_up(tmp_path, config, "run")
    runs.append(up)
    assert up.wait_url(timeout=240) == up.url
    pids = up.pids()
    assert len(pids) == 3 and all(pids), up.state()  # llama-server, agent, redis-server

    up.proc.kill()
    up.proc.wait(timeout=10)
    left = wait_gone(pids, timeout=15)
    assert not left, f"still running 15 s after a SIGKILL of up: {describe(left)}"
    assert not strays(tmp_path)


def test_sigterm_after_a_pod_restart_stops_everything_within_10s(tmp_path: Path, llama_server_bin: Path,
                                                                runs: list[Up]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_yaml(llama_server_bin, replicas=1, context=8192, prefix=RULES))
    up = start_up(tmp_path, config, "run")
    runs.append(up)
    profile = make_profile(WorkloadSpec(prefix_chars=12_000, seed=29, workspace="/home/dev/strays"))
    with httpx.Client(timeout=300.0) as http:
        wait_health(http, up.url, timeout=240)
        body = profile.request("tiny-dense", "Please list the files.", max_tokens=4, stream=False)
        assert http.post(up.url + "/v1/chat/completions", json=body).status_code == 200
        victim = up.process("t-0 llama-server")["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_health(http, up.url, timeout=30, want=503)
        _, health = wait_health(http, up.url, timeout=120)
        assert health["fleet"]["restarts"] == 1
        restarted = up.process("t-0 llama-server")["pid"]
        assert restarted != victim
        # Traffic on the restarted pod: the gateway's resync, first sight and background work run
        # against it when the SIGTERM comes.
        assert http.post(up.url + "/v1/chat/completions", json=body).status_code == 200

    pids = up.pids()
    started = time.monotonic()
    up.proc.send_signal(signal.SIGTERM)
    try:
        code = up.proc.wait(timeout=10)
    except Exception as exc:
        raise AssertionError(f"up did not exit within 10 s of SIGTERM:\n{up.stderr_tail()}") from exc
    took = time.monotonic() - started
    assert code == 0, up.stderr_tail()
    left = wait_gone(pids, timeout=1)
    assert not left, f"still running after up exited: {describe(left)}"
    assert not strays(tmp_path)
    assert took < 10


async def test_stop_ends_pods_and_redis_in_time_when_the_gateway_hangs_in_its_shutdown(
    tmp_path: Path, llama_server_bin: Path,
) -> None:
    """A gateway background task that swallows its cancel (as `suppress(CancelledError)` around an
    await does) keeps the gateway's shutdown waiting forever: the fleet's stop cuts that step off,
    says so, and still stops the pods and redis-server, all within 10 s."""
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_yaml(llama_server_bin, replicas=1))
    log = io.StringIO()
    fleet = LocalFleet(load_fleet(config), UpOptions(port=0, run_dir=tmp_path / "run", pod_timeout=60.0),
                       Reporter(log))
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await released.wait()

    try:
        await fleet.start()
        await fleet.wait_ready(120.0)
        assert fleet.redis is not None and fleet.redis.proc is not None
        pids = [c.pid for pod in fleet.pods for c in pod.children] + [fleet.redis.proc.pid]
        fleet.app.state.gateway.tasks.spawn(stubborn(), name="stubborn")
        started = time.monotonic()
        await fleet.stop()
        took = time.monotonic() - started
    finally:
        released.set()  # the gateway's lifespan may end now (a test loop closing waits for it)
        await fleet.stop()
    assert took < 10, log.getvalue()
    assert "stopping the gateway: TimeoutError" in log.getvalue(), log.getvalue()
    left = wait_gone([pid for pid in pids if pid is not None], timeout=1)
    assert not left, f"still running after the stop: {describe(left)}"

"""`llamafleet up` end to end: real llama-servers, agents, Redis and gateway, run as a subprocess so that
signals are real. One small fleet (2 pods x 2 slots, tiny dense model, a prefix of a few thousand chars).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llamafleet_core import podspec
from llamafleet_local.up import load_fleet
from tests.local.up_bed import Up, alive, describe, fleet_yaml, start_up, strays, wait_health

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SYSTEM = " ".join(
    f"Rule {i}: keep answers short, cite files by path, and never guess a number." for i in range(60))


@pytest.fixture
def up(tmp_path: Path, llama_server_bin: Path) -> Iterator[Up]:
    config_path = tmp_path / "fleet.yaml"
    config_path.write_text(fleet_yaml(llama_server_bin, prefix=SYSTEM))
    running = start_up(tmp_path, config_path, "run")
    try:
        yield running
    finally:
        running.terminate()


def test_up_is_healthy_only_when_warm_serves_the_prefix_and_stops_clean(
    up: Up, llama_server_bin: Path,
) -> None:
    """/health is 503 until both pods hold the prefix, then 200; a chat request through the gateway reuses
    the prefix (`cache_n`); every process logs into the run folder; llama-server runs the shared renderer's
    argv byte for byte; SIGTERM leaves no process behind and exits 0."""
    with httpx.Client(timeout=60.0) as http:
        seen, body = wait_health(http, up.url, timeout=240)
        assert 503 in seen, "the gateway must answer (503) while the fleet is still coming up"
        fleet = body["fleet"]
        assert fleet["ready"] and fleet["pods_up"] == 2 and fleet["prefixes_warm"] == 1
        prefix = fleet["shared_prefixes"]["rules"]
        assert prefix["warm"] == 2 and prefix["tokens"] > 500

        request = {"model": "tiny-dense", "max_tokens": 4,
                   "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi?"}]}
        for _ in range(3):  # every session lands on a slot or snapshot already holding the prefix
            resp = http.post(up.url + "/v1/chat/completions", json=request)
            assert resp.status_code == 200, resp.text
            assert resp.json()["timings"]["cache_n"] >= prefix["tokens"] - 1, resp.headers

        pod_urls = sorted(p["url"] for p in body["pods"])
    assert up.proc.stdout is not None
    assert up.proc.stdout.readline().decode().strip() == up.url

    for name in ("t-0.llama-server", "t-0.agent", "t-1.llama-server", "t-1.agent", "gateway", "redis"):
        log = up.run_dir / f"{name}.log"
        assert log.is_file() and log.stat().st_size > 0, name

    config = load_fleet(up.config_path)
    spec = config.effective_spec()
    servers = [p for p in up.state()["processes"] if p["name"].endswith("llama-server")]
    for proc in servers:
        cmdline = Path(f"/proc/{proc['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
        argv = [a.decode() for a in cmdline]
        port = int(argv[argv.index("--port") + 1])
        assert f"http://127.0.0.1:{port}" in pod_urls
        pod = proc["name"].split()[0]
        expected = podspec.llama_server_args(
            spec, model_path=argv[argv.index("-m") + 1], port=port,
            slot_save_path=str(up.run_dir.parent / "state" / "snapshots" / pod), host="127.0.0.1")
        assert argv == [str(llama_server_bin), *expected]

    pids = up.pids()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=60) == 0
    alive_after = [pid for pid in pids if alive(pid)]
    assert not alive_after, f"still running after SIGTERM: {describe(alive_after)}"
    assert not strays(up.run_dir.parent)


def test_up_restarts_and_rewarms_a_pod_whose_server_died(up: Up) -> None:
    """A llama-server killed with SIGKILL: /health turns 503, the pod comes back at the same URL with the
    prefix warm again (from its snapshot folder, no prefill), and /health is 200 again."""
    with httpx.Client(timeout=60.0) as http:
        wait_health(http, up.url, timeout=240)
        victim = next(p for p in up.state()["processes"] if p["name"] == "t-1 llama-server")
        os.kill(victim["pid"], signal.SIGKILL)
        wait_health(http, up.url, timeout=30, want=503)
        _, body = wait_health(http, up.url, timeout=120)
    fleet = body["fleet"]
    assert fleet["restarts"] == 1 and fleet["shared_prefixes"]["rules"]["warm"] == 2
    restarted = next(p for p in up.state()["processes"] if p["name"] == "t-1 llama-server")
    assert restarted["pid"] != victim["pid"] and restarted["argv"] == victim["argv"]
    assert "exited with code" in up.stderr.read_text()


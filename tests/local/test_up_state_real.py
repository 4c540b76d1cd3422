"""The state folder of `llamafleet up` with real processes: snapshots saved in one run are restored in the
next, and one folder serves one `up` at a time.

One pod x 2 slots, tiny dense model, no SharedPrefix: the snapshots come from the gateway's first sight
of an agent session's prefix (~12K characters), as with a real agent client.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_testbed.workload import WorkloadSpec, make_profile, next_day
from tests.local.up_bed import UP, Up, fleet_yaml, start_up, wait_health

pytestmark = [pytest.mark.llama, pytest.mark.redis]

SPEC = WorkloadSpec(prefix_chars=12_000, seed=23, workspace="/home/dev/state")
MODEL = "tiny-dense"


@pytest.fixture
def config_path(tmp_path: Path, llama_server_bin: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(llama_server_bin, replicas=1, slots=2, context=8192))
    return path


def ask(http: httpx.Client, up: Up, spec: WorkloadSpec, question: str) -> tuple[str, str]:
    """One non-streaming agent request through the gateway: (x-llamafleet-action, x-llamafleet-snapshot)."""
    body = make_profile(spec).request(MODEL, question, max_tokens=4, stream=False)
    resp = http.post(up.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.headers.get("x-llamafleet-action", ""), resp.headers.get("x-llamafleet-snapshot", "")


def listing(http: httpx.Client, up: Up, pod: str = "t-0") -> dict[str, dict[str, Any]]:
    """The pod's agent's own list of its snapshots (`GET /v1/snapshots`, with this run's token)."""
    resp = http.get(up.agent_url(pod) + "/v1/snapshots",
                    headers={"Authorization": f"Bearer {up.agent_token}"})
    assert resp.status_code == 200, resp.text
    return {m["name"]: m for m in resp.json()["snapshots"]}


def test_snapshots_outlive_up_and_the_next_run_restores_them(
    tmp_path: Path, config_path: Path, runs: list[Up],
) -> None:
    """Run 1 computes a session's prefix on first sight and saves it into the state folder; run 2 (a new
    run folder, the same state folder, a new gateway, Redis and agent token) lists the same snapshots
    on its agent, and the first session of the next day restores the stage before its date line
    instead of computing it, as does the next session of the first day. While run 2 holds the folder,
    a third `up` on it is refused with exit code 2, naming the folder and --state-dir."""
    state = tmp_path / "state"
    with httpx.Client(timeout=300.0) as http:
        first = start_up(tmp_path, config_path, "run1")
        runs.append(first)
        wait_health(http, first.url, timeout=240)
        action, _ = ask(http, first, SPEC, "Please list the files in the workspace.")
        assert action == "compute/first_sight", action
        saved = listing(http, first)
        assert any(n.startswith("fs-") for n in saved) and any(n.startswith("st-") for n in saved), saved
        assert all((state / "snapshots" / "t-0" / f"{n}.bin").is_file() for n in saved), saved
        argv = first.process("t-0 agent")["argv"]
        assert argv[argv.index("--snapshot-dir") + 1] == str(state / "snapshots" / "t-0")
        assert "--budget-bytes" in argv  # the agent still keeps the folder under the fleet's budget
        assert first.terminate() == 0

        second = start_up(tmp_path, config_path, "run2")
        runs.append(second)
        wait_health(http, second.url, timeout=240)
        assert second.agent_token != first.agent_token
        kept = listing(http, second)
        assert set(saved) <= set(kept), (sorted(saved), sorted(kept))

        refused = subprocess.run(
            [*UP, "-f", str(config_path), "--port", "0", "--run-dir", str(tmp_path / "run3"),
             "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr
        assert str(state) in refused.stderr and "--state-dir" in refused.stderr, refused.stderr
        assert not (tmp_path / "run3" / "state.json").exists()  # refused before starting anything

        later, snapshot = ask(http, second, next_day(SPEC), "Please run the tests.")
        assert later.startswith("restore"), (later, snapshot)
        assert snapshot in kept, (snapshot, sorted(kept))
        again, _ = ask(http, second, SPEC, "Please explain the build.")
        assert not again.startswith("compute"), again
        assert second.terminate() == 0


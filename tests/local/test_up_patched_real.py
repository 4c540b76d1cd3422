"""A whole local fleet on the real patched llama-server, driven with Hermes Agent's request layout.

`llamafleet up` with the default `prefixSharing: auto` reads the binary's `--help`, finds `--slot-attach`
and `--cache-prefix`, and runs every pod with both (over a unified KV pool). The gateway routes those
pods with their pod-level reuse: a session whose head another slot of the pod holds is sent there
directly, and the server attaches the cells or copies its RAM prefix entry. The test checks what the
servers themselves say they shared, through the gateway's count of it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import httpx
import pytest

from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import WorkloadSpec
from tests.local.up_bed import Up, fleet_yaml, start_up, wait_health

pytestmark = [pytest.mark.llama, pytest.mark.redis, pytest.mark.slow]

PROFILE = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2)))
SHARED = "llamafleet_router_server_shared_tokens_total"


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples over its labels in a Prometheus text page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


async def _sessions(url: str, questions: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=600.0) as http:
        return list(await asyncio.gather(*(
            http.post(url + "/v1/chat/completions",
                      json=PROFILE.request("tiny-dense", q, max_tokens=4, stream=False))
            for q in questions)))


def test_a_fleet_of_patched_pods_runs_attach_and_prefix_entries_and_shares_the_agents_head(
    tmp_path: Path, patched_llama_server_bin: Path
) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_yaml(patched_llama_server_bin, replicas=2, slots=3, context=16_384)
                      .replace("contextPerSlot: 16384", "contextPerSlot: 16384\n  kvUnified: true"))
    up: Up = start_up(tmp_path, config, "run")
    try:
        with httpx.Client(timeout=60.0) as http:
            wait_health(http, up.url, timeout=300)
        servers = [p for p in up.state()["processes"] if p["name"].endswith("llama-server")]
        assert len(servers) == 2
        for proc in servers:
            assert "--slot-attach" in proc["argv"] and "--cache-prefix" in proc["argv"], proc["argv"]
            assert "-kvu" in proc["argv"]

        burst = asyncio.run(_sessions(up.url, [f"Session {i}: list the changed files." for i in range(3)]))
        later = asyncio.run(_sessions(up.url, ["Session 3: run the tests.", "Session 4: fix the lint."]))
        answers = burst + later
        assert all(r.status_code == 200 for r in answers), [r.text[:200] for r in answers]
        actions = [r.headers.get("x-llamafleet-action") for r in answers]
        head = min(r.json()["usage"]["prompt_tokens"] for r in answers) - 40
        # every session reused nearly all of the head: from a slot, or from another slot's cells
        reused = [r.json()["timings"]["cache_n"] for r in answers]
        assert all(n >= 0.9 * head for n in reused), (head, list(zip(actions, reused, strict=True)))
        # the burst's sessions waited for the one build of the head and attached its cells (no
        # snapshot restored into a slot of the pod building it, none primed)
        attached = sum(r.json()["timings"]["attached_n"] for r in burst)
        assert attached >= 2 * 0.9 * head, (attached, head, actions)
        computed = 0.0
        with httpx.Client(timeout=60.0) as http:
            for proc in servers:
                port = proc["argv"][proc["argv"].index("--port") + 1]
                page = http.get(f"http://127.0.0.1:{port}/metrics").text
                computed += _metric(page, "llamacpp:prompt_tokens_total")
            metrics = http.get(up.url + "/metrics").text
        assert computed < 1.3 * head, (computed, head, actions)  # the head computed once in the fleet
        assert _metric(metrics, SHARED) >= attached
    finally:
        assert up.terminate() == 0, up.stderr_tail()

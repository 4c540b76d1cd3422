"""A whole local fleet on the real patched llama-server, driven with Hermes Agent's request layout.

`llamafleet up` with the default `prefixSharing: auto` and `kvUnified` unset reads the binary's `--help`,
finds `--slot-attach` and `--cache-prefix`, and runs every pod with both over a unified KV pool. The
gateway routes those pods with their pod-level reuse: a session whose head another slot of the pod
holds, or the pod keeps as a RAM prefix entry, is sent there directly, and the server attaches the
cells or loads the entry. The tests check what the servers themselves say they shared and kept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from llamafleet_testbed.hermes_layout import ClientProfile, hermes_profile, load_layout
from llamafleet_testbed.workload import WorkloadSpec
from tests.local.up_bed import Up, fleet_yaml, start_up, wait_health

pytestmark = [pytest.mark.llama, pytest.mark.redis, pytest.mark.slow]

PROFILE = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2)))
# Another agent's head, parting from the first within its first tokens: its tools in another order and
# its system prompt with a line of its own first (another day's would share all but the date line)
_LAYOUT = load_layout()
OTHER_AGENT = hermes_profile(WorkloadSpec(day=dt.date(2026, 11, 2)), layout={
    **_LAYOUT, "tools": list(reversed(_LAYOUT["tools"])),
    "system_prompt": "You are the release agent.\n" + _LAYOUT["system_prompt"]})
SHARED = "llamafleet_router_server_shared_tokens_total"


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples over its labels in a Prometheus text page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


async def _sessions(url: str, questions: list[str], profile: ClientProfile = PROFILE) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=600.0) as http:
        return list(await asyncio.gather(*(
            http.post(url + "/v1/chat/completions",
                      json=profile.request("tiny-dense", q, max_tokens=4, stream=False))
            for q in questions)))


@contextmanager
def _patched_fleet(tmp_path: Path, binary: Path, *, slots: int) -> Iterator[Up]:
    """`llamafleet up` of two tiny-dense pods of `slots` slots on the patched binary, healthy; stopped
    (and checked to exit cleanly) after the test."""
    config = tmp_path / "fleet.yaml"
    config.write_text(fleet_yaml(binary, replicas=2, slots=slots, context=16_384))
    up: Up = start_up(tmp_path, config, "run")
    try:
        with httpx.Client(timeout=60.0) as http:
            wait_health(http, up.url, timeout=300)
        yield up
    finally:
        assert up.terminate() == 0, up.stderr_tail()


def test_a_fleet_of_patched_pods_runs_attach_and_prefix_entries_and_shares_the_agents_head(
    tmp_path: Path, patched_llama_server_bin: Path
) -> None:
    with _patched_fleet(tmp_path, patched_llama_server_bin, slots=3) as up:
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


def test_a_head_a_pod_keeps_in_ram_is_routed_there_and_loaded_from_its_prefix_entry(
    tmp_path: Path, patched_llama_server_bin: Path
) -> None:
    """Once another head took every slot, the pod that keeps the first head as a RAM prefix entry (the
    server said so: `timings.prefix_entry_n`) is where that head's next session goes, directly, and the
    server loads it from RAM rather than the gateway restoring a snapshot or the server computing."""
    with _patched_fleet(tmp_path, patched_llama_server_bin, slots=1) as up:
        (first,) = asyncio.run(_sessions(up.url, ["Session 0: list the changed files."]))
        assert first.status_code == 200, first.text[:200]
        keeper = first.headers["x-llamafleet-pod"]
        entry = first.json()["timings"]["prefix_entry_n"]
        assert entry > 0, first.json()["timings"]
        # another agent's sessions, at once, take the slot of each pod
        taken = asyncio.run(_sessions(up.url, ["Session 1: run the tests.", "Session 2: fix the lint."],
                                      OTHER_AGENT))
        assert all(r.status_code == 200 for r in taken), [r.text[:200] for r in taken]
        pods = {r.headers["x-llamafleet-pod"] for r in taken}
        assert len(pods) == 2 and keeper in pods, pods

        (again,) = asyncio.run(_sessions(up.url, ["Session 3: explain the failure."]))
        assert again.status_code == 200, again.text[:200]
        timings = again.json()["timings"]
        assert (again.headers["x-llamafleet-pod"], again.headers["x-llamafleet-action"]) == \
            (keeper, "direct/ram_hit"), timings
        # the server took it from RAM: its prefix entry, or the fuller state of the slot's previous
        # session, which upstream's cache kept when the other agent took the slot (whichever holds more)
        assert timings["cache_n"] >= entry and timings["prompt_n"] < 200, (timings, entry)

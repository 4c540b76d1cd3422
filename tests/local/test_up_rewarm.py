"""`up` keeps a restarted pod out of rotation until every SharedPrefix is warm on it again.

Real fleets (`llamafleet up` in process: 2 llama-servers, agents, Redis, the gateway). Pod 1's
llama-server is killed while no copy of the SharedPrefix snapshot can reach it (its own file deleted, the
peer's hidden): after the restart warming fails, and the pod must stay unroutable, said loudly, rather
than serve cold. Once the peer can serve the snapshot again, a later warming attempt makes it warm and
routable without anyone stepping in. And a pod started again is not ready by the declaration its agent
kept from before: only `up`'s own warming declares it.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_local.up import LocalFleet, UpOptions
from llamafleet_local.up.progress import Reporter
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_testbed.reliability.bed import PREFIX, fleet_config, kill, running_fleet, until

pytestmark = [pytest.mark.llama, pytest.mark.redis]


async def test_a_restarted_pod_that_cannot_be_warmed_is_not_routed_to_and_warming_is_retried(
    llama_server_bin: Path, tmp_path: Path,
) -> None:
    async with running_fleet(llama_server_bin, tmp_path / "run", snapshots=False) as bed:
        progress = bed.fleet.progress
        name = bed.fleet.results[PREFIX].snapshot
        victim, peer = bed.pod(1), bed.pod(0)
        for path in victim.layout.snapshot_dir.glob(f"{name}.*"):
            path.unlink()
        hidden = peer.layout.snapshot_dir / f"{name}.json"  # the peer's agent serves only what it lists
        manifest = hidden.read_bytes()
        hidden.unlink()
        kill(victim.server.pid)

        async def failed() -> bool:
            return progress.restarts == 1 and progress.prefixes[PREFIX].pods[victim.name].state == "failed"

        assert await until(failed, 60.0) is not None, bed.log.getvalue()
        # What keeps it out of rotation: its llama-server answers, so discovery routes to it as soon as
        # its agent's /ready (the routing gate) says 200; it must say 503 after the failed warming.
        assert (await bed.http.get(victim.layout.llama_url + "/health")).status_code == 200
        assert (await bed.http.get(victim.layout.agent_url + "/ready")).status_code == 503
        assert not await bed.pod_ready(1)
        assert not victim.ready and victim.name not in progress.pods_up and not progress.ready
        assert f"{victim.name} is NOT routable" in bed.log.getvalue()

        hidden.write_bytes(manifest)
        assert await until(lambda: bed.pod_ready(1), 30.0) is not None, bed.log.getvalue()
        assert progress.prefixes[PREFIX].pods[victim.name].state == "warm"
        assert victim.ready and progress.ready and progress.restarts == 1
        assert f"{victim.name} is warm again and routable" in bed.log.getvalue()


async def test_a_pod_up_restarts_is_routed_around_at_once_whatever_discovery_polled(
    llama_server_bin: Path, tmp_path: Path,
) -> None:
    """`up` tells its gateway a pod is down as soon as it sees it die: with discovery polling too seldom
    to see the kill and the restart between two polls (as when the loop they share is busy starting the
    pod), the restarted pod, which cannot be warmed, is still not routed to."""
    async with running_fleet(llama_server_bin, tmp_path / "run", snapshots=False) as bed:
        discovery = bed.gateway.discovery
        assert isinstance(discovery, StaticDiscovery) and await bed.pod_ready(1)
        # Discovery's watchers stop polling: each finishes one poll begun from now on (its next sleep is
        # an hour long), then the pod dies. Only `up` can tell the gateway.
        discovery._interval = 3600.0
        polled: list[object] = []
        refresh = discovery._refresh

        async def counted(pod: Any) -> None:
            try:
                await refresh(pod)
            finally:  # a poll that fails (a peer still busy computing) also ends in the hour-long sleep
                polled.append(pod)

        discovery._refresh = counted  # type: ignore[method-assign]

        async def both_polled() -> bool:
            return len(set(map(id, polled))) == 2

        # A poll may take the hang timeout and the agent's (3 + 5 s) while a pod computes.
        assert await until(both_polled, 30.0) is not None
        name = bed.fleet.results[PREFIX].snapshot
        victim, peer = bed.pod(1), bed.pod(0)
        for path in victim.layout.snapshot_dir.glob(f"{name}.*"):
            path.unlink()
        (peer.layout.snapshot_dir / f"{name}.json").unlink()
        kill(victim.server.pid)
        progress = bed.fleet.progress

        async def failed() -> bool:
            return progress.restarts == 1 and progress.prefixes[PREFIX].pods[victim.name].state == "failed"

        assert await until(failed, 60.0) is not None, bed.log.getvalue()
        assert (await bed.http.get(victim.layout.llama_url + "/health")).status_code == 200
        assert not await bed.pod_ready(1)
        assert await bed.pod_ready(0)


async def test_a_pod_started_again_waits_for_ups_declaration_not_the_one_its_agent_kept(
    llama_server_bin: Path, tmp_path: Path,
) -> None:
    """The agent keeps what it must hold in the snapshot folder (for a container restart without a
    warmer around). A pod `up` starts again holds all its snapshot files, yet its `/ready` (the gateway's
    routing gate) stays 503 until `up` has warmed it and declared them."""
    options = UpOptions(port=0, run_dir=tmp_path / "run", pod_timeout=60.0)
    async with LocalFleet(fleet_config(llama_server_bin), options, Reporter(io.StringIO())) as fleet:
        await fleet.wait_ready(180.0)
        pod = fleet.pods[1]
        ready = pod.layout.agent_url + "/ready"
        assert (await fleet.http.get(ready)).status_code == 200
        await pod.stop()
        await pod.start(fleet.http, fleet.agent_token, 60.0)
        assert (await fleet.http.get(ready)).status_code == 503
        await fleet.require(pod)
        assert (await fleet.http.get(ready)).status_code == 200


async def test_a_pod_that_missed_a_prefix_at_start_is_not_routed_to_until_warming_again_succeeds(
    llama_server_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At start, pod 1's copy of the SharedPrefix fails (its first pull is refused): it must not be
    declared ready with nothing (routable cold while its peer holds the prefix), but stay out of
    rotation until the supervisor's next warming attempt succeeds."""
    refused: list[str] = []
    real_pull = AgentClient.pull

    async def pull_failing_once(self: AgentClient, name: str, source: str, **kwargs: Any) -> Any:
        if not refused:
            refused.append(name)
            raise AgentError("injected: the first copy is cut", 502, "peer")
        return await real_pull(self, name, source, **kwargs)

    monkeypatch.setattr(AgentClient, "pull", pull_failing_once)
    log = io.StringIO()
    options = UpOptions(port=0, run_dir=tmp_path / "run", pod_timeout=60.0)
    async with LocalFleet(fleet_config(llama_server_bin), options, Reporter(log)) as fleet:
        assert refused, "warming pulled nothing: the fleet has one pod?"
        pod = fleet.pods[1]
        progress = fleet.progress
        assert progress.prefixes[PREFIX].pods[pod.name].state == "failed"
        assert (await fleet.http.get(fleet.pods[0].layout.agent_url + "/ready")).status_code == 200
        assert (await fleet.http.get(pod.layout.agent_url + "/ready")).status_code == 503
        assert not pod.ready and not progress.ready
        assert f"{pod.name} is NOT routable" in log.getvalue()

        stop = asyncio.Event()
        keeper = asyncio.create_task(fleet.run_until(stop))
        try:
            await fleet.wait_ready(60.0)
        finally:
            stop.set()
            await keeper
        assert progress.prefixes[PREFIX].pods[pod.name].state == "warm"
        assert (await fleet.http.get(pod.layout.agent_url + "/ready")).status_code == 200
        assert f"{pod.name} is warm again and routable" in log.getvalue()

"""`up` keeps a restarted pod out of rotation until every SharedPrefix is warm on it again.

A real fleet (`llamafleet up` in process: 2 llama-servers, agents, Redis, the gateway). Pod 1's
llama-server is killed while no copy of the SharedPrefix snapshot can reach it (its own file deleted, the
peer's hidden): after the restart warming fails, and the pod must stay unroutable, said loudly, rather
than serve cold. Once the peer can serve the snapshot again, a later warming attempt makes it warm and
routable without anyone stepping in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llamafleet_local.reliability.bed import PREFIX, kill, running_fleet, until

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
        # Discovery polls every 0.5 s: had the pod been declared ready, the gateway would route to it now.
        await asyncio.sleep(2.0)
        assert not await bed.pod_ready(1)
        assert not victim.ready and victim.name not in progress.pods_up and not progress.ready
        assert f"{victim.name} is NOT routable" in bed.log.getvalue()

        hidden.write_bytes(manifest)
        assert await until(lambda: bed.pod_ready(1), 30.0) is not None, bed.log.getvalue()
        assert progress.prefixes[PREFIX].pods[victim.name].state == "warm"
        assert victim.ready and progress.ready and progress.restarts == 1
        assert f"{victim.name} is warm again and routable" in bed.log.getvalue()

"""Finding 13 of the security review: pods whose llama-server runs with its own API key still work.

A fleet with `apiKeySecretRef` starts llama-server with `--api-key-file`; before the fix nothing that
calls it sent the key, so everything but `/health` answered 401: the agents never read `/props`, pods
never became ready, discovery saw them down. Here the real `up` fleet runs key-protected llama-servers
(the key is really on: without it they answer 401), and every caller sends the key: `up`'s warming (the
fleet gets ready at all), the agents (save, pull, restore), the gateway's discovery polls, its forwarded
requests and its first-sight prefills, and a separate `llamafleet router` process configured with
`LLAMAFLEET_ROUTER_POD_API_KEY_FILE`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llamafleet_core.agent_client import AgentClient
from llamafleet_core.llama_client import LlamaClient
from llamafleet_testbed.reliability.bed import PREFIX, Bed, kill, running_fleet, until
from llamafleet_testbed.reliability.replicas import start_replica

pytestmark = [pytest.mark.llama, pytest.mark.redis]

OTHER_SYSTEM = " ".join(f"Note {i}: answer in one sentence and name the file you mean." for i in range(60))


@pytest.fixture
async def bed(llama_server_bin: Path, tmp_path: Path) -> AsyncIterator[Bed]:
    async with running_fleet(llama_server_bin, tmp_path / "run", pod_api_key=True) as fleet:
        yield fleet


async def test_key_protected_pods_are_warmed_discovered_and_served(bed: Bed) -> None:
    key = bed.fleet.pod_api_key
    assert key, "the fleet sets apiKeySecretRef"
    auth = {"Authorization": f"Bearer {key}"}
    for pod in bed.fleet.pods:
        # /metrics too: the chart's llama-server PodMonitor must send the key (metrics.serverPodMonitor).
        for path in ("/slots", "/props", "/metrics"):
            assert (await bed.http.get(pod.layout.llama_url + path)).status_code == 401, path
            assert (await bed.http.get(pod.layout.llama_url + path, headers=auth)).status_code == 200, path

    # Warming prefilled and saved the SharedPrefix on a pod and pulled it to the other.
    result = bed.fleet.results[PREFIX]
    assert result.snapshot and [p.state for p in result.pods] == ["warm", "warm"], result.pods
    # Discovery polls /slots and /props: both pods are routable.
    assert [await bed.pod_ready(i) for i in range(2)] == [True, True]

    # Forwarded requests, streamed and not; a new session prefix: first sight prefills and saves it.
    for i, (stream, system) in enumerate([(True, None), (False, None), (False, OTHER_SYSTEM),
                                          (True, OTHER_SYSTEM)]):
        body = bed.body(i, stream=stream) if system is None else bed.body(i, stream=stream, system=system)
        resp = await bed.http.post(bed.url + "/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text[:300]
        assert b"Invalid API Key" not in resp.content
    assert bed.sample("llamafleet_router_snapshot_saves_total") > 0, "first sight saved nothing"
    assert bed.sample("llamafleet_router_snapshot_failures_total") == 0

    # The agents call their llama-server with the key: save on pod 0, pull to pod 1, restore there.
    a, b = (AgentClient(bed.pod(i).layout.agent_url, bed.http, bed.fleet.agent_token) for i in range(2))
    llama = LlamaClient(bed.pod(0).layout.llama_url, bed.http, key)
    tokens = await llama.tokenize("A conversation about the build: step three failed twice. " * 10)
    await llama.prefill(tokens, slot=1)
    saved = await a.save(1, "keyed", tokens=tokens)
    assert saved.n_tokens == len(tokens)
    await b.pull("keyed", bed.pod(0).layout.agent_url)
    assert (await b.restore("keyed", slot=0)).n_tokens == len(tokens)


async def test_a_router_process_sends_the_key_from_its_key_file(bed: Bed) -> None:
    """`llamafleet router` with LLAMAFLEET_ROUTER_POD_API_KEY_FILE (the chart mounts `podApiKey`):
    its discovery sees the key-protected pods up and its answers come from them."""
    assert bed.fleet.pod_api_key_file is not None
    proc, url = start_replica(bed, bed.fleet.run_dir / "gateway-keyed.log")
    try:
        async def answers() -> bool:
            try:
                resp = await bed.http.post(url + "/v1/chat/completions", json=bed.body(0, stream=False),
                                           timeout=30.0)
            except httpx.HTTPError:
                return False
            return resp.status_code == 200

        assert await until(answers, 60.0, every=0.2) is not None, "the router never served a request"
    finally:
        kill(proc.pid)
        proc.wait(10)

"""SharedPrefix end to end: the operator warms real pods that a test kubelet runs, and cleans up after.

Real llama-server processes (the tiny dense model) and real agents realize the pods the operator's
Deployment asks for; the operator reaches them through the pod IPs and ports the kubelet reports, exactly
as it would in a cluster. Redis is real too: the prefix index and the fleet membership live there.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from llamafleet_core import membership
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kubelet import Kubelet, operated_node, tiny_dense_fleet
from tests.operator.operator_bed import (
    FLEETS,
    NS,
    PREFIXES,
    create,
    delete,
    emulated_api,
    eventually,
    obj,
    patch_spec,
)

TOKEN = "operator-test-token"
SYSTEM = ("You are the fleet's careful assistant. You answer questions about llama-server pods, slots and "
          "snapshots, briefly and exactly. ") * 12
TOOLS = [{"type": "function", "function": {
    "name": "get_pod", "description": "Look up one pod of the fleet by name.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]

pytestmark = [pytest.mark.llama, pytest.mark.redis, pytest.mark.slow]


def prefix_manifest() -> dict[str, Any]:
    return {"apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix",
            "metadata": {"name": "agent-prefix", "namespace": NS},
            "spec": {"fleetRef": {"name": "tiny"}, "tools": TOOLS,
                     "messages": [{"role": "system", "content": SYSTEM}]}}


def status(api: Any, resource: Any, name: str) -> dict[str, Any]:
    return dict((obj(api, resource, name) or {}).get("status") or {})


async def held(node: Kubelet, pod: str) -> list[str]:
    return [m.name for m in await node.pods[pod].agent.list()]


async def test_shared_prefix_warm_everywhere_and_removed_when_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path, tiny_models: Any,
        redis_url: str) -> None:
    """Status reaches Ready with every pod warm; a new replica holds the snapshot before it turns Ready;
    membership in Redis follows the pods; a spec change replaces the snapshot on every pod; deleting the
    SharedPrefix removes its snapshots everywhere."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(
            kubeconfig=kubeconfig, namespaces=[NS], redis_url=redis_url, index_prefix=prefix,
            agent_token=TOKEN, reconcile_interval_s=0.5, prefix_interval_s=0.5,
            allowed_host_paths=[str(tiny_models.dense.parent)])
        async with operated_node(api, settings, binary=llama_server_bin, model=tiny_models.dense,
                                 workdir=tmp_path / "node", token=TOKEN) as node:
            await create(api, tiny_dense_fleet(tiny_models.dense, slots=2, contextPerSlot=4096))
            await eventually(lambda: status(api, FLEETS, "tiny").get("ready") == "1/1", 60, "first pod Ready")

            await create(api, prefix_manifest())
            st = await eventually(lambda: status(api, PREFIXES, "agent-prefix").get("phase") == "Warm"
                                  and status(api, PREFIXES, "agent-prefix"), 60, "prefix warm")
            assert st["warm"] == "1/1" and st["tokens"] > 200 and st["bytes"] > 0 and st["hash"]
            conds = {c["type"]: c for c in st["conditions"]}
            assert conds["Ready"]["status"] == "True" and conds["Degraded"]["status"] == "False"
            snapshot = (await held(node, "tiny-0"))[0]
            assert snapshot.startswith("sp-agent-prefix-")

            await patch_spec(api, "llamafleets", "tiny", {"replicas": 2})
            await eventually(lambda: status(api, PREFIXES, "agent-prefix").get("warm") == "2/2", 90,
                             "second pod warm")
            await eventually(lambda: status(api, FLEETS, "tiny").get("ready") == "2/2", 30, "both Ready")
            assert node.pods["tiny-1"].held_when_ready == [snapshot], "Ready before it held the prefix"
            assert not node.errors

            client = aioredis.Redis.from_url(redis_url)
            try:
                async def routable() -> list[membership.Member] | None:
                    members = await membership.read_members(client, NS, "tiny", prefix=prefix)
                    return members if len(members) == 2 and all(m.ready for m in members) else None

                members = await eventually(routable, 20, "membership of both pods")
                assert {m.name for m in members} == {"tiny-0", "tiny-1"}
                assert all(m.warm == ("agent-prefix",) for m in members)
                assert all(m.slots == 2 and m.ip == "127.0.0.1" for m in members)
                assert len({m.uid for m in members}) == 2 and all(m.epoch > 0 for m in members)
            finally:
                await client.aclose()

            # A changed prefix is a new snapshot everywhere, and the old one goes.
            old_hash = status(api, PREFIXES, "agent-prefix")["hash"]
            await patch_spec(api, "sharedprefixes", "agent-prefix",
                             {"messages": [{"role": "system", "content": SYSTEM + " Be terse."}]})
            st = await eventually(lambda: (s := status(api, PREFIXES, "agent-prefix")).get("hash") != old_hash
                                  and s.get("warm") == "2/2" and s, 60, "re-warmed with a new hash")

            async def only_new() -> list[str] | None:
                on0, on1 = await held(node, "tiny-0"), await held(node, "tiny-1")
                return on0 if on0 == on1 and len(on0) == 1 and on0[0] != snapshot else None

            renewed = await eventually(only_new, 20, "old snapshot removed, new one on both pods")
            assert renewed[0].endswith(st["hash"][:12])

            await delete(api, f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/sharedprefixes/agent-prefix")
            await eventually(lambda: obj(api, PREFIXES, "agent-prefix") is None, 30, "finalizer released")
            assert await held(node, "tiny-0") == [] and await held(node, "tiny-1") == []
            # No longer required: both pods stay Ready without it.
            await eventually(lambda: all(p.ready for p in node.pods.values()), 10, "pods still Ready")

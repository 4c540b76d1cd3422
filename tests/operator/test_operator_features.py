"""`prefixSharing: auto` end to end: a pod's agent reports its image's features, the operator turns the
flags on.

The API is the kmock emulator and kopf runs the real handlers. The test is the kubelet: it creates the
pods the Deployment asks for and serves each pod's agent with the real agent app on a loopback port, its
help file written by the test the way the detector init container writes it in a cluster. No llama-server
runs: what is under test is what the operator does with the agent's report, which does not depend on it.
Redis is real: the membership the gateway reads must carry each pod's own attach flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core import labels as L
from llamafleet_core import membership
from llamafleet_core.agent_tokens import namespace_token
from llamafleet_core.index.redis_conn import connect
from llamafleet_local.redis_server import free_port
from llamafleet_operator.settings import OperatorSettings
from tests.agent.test_app_offline import PropsOnly as NoServer  # no slot operation is expected
from tests.core.test_features import PATCHED_HELP
from tests.operator.kmock_support import KubeEmulator
from tests.operator.operator_bed import (
    DEPLOYMENTS,
    FLEETS,
    NS,
    container,
    create,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    patch_spec,
    running_operator,
)

TOKEN = "features-test-token"
PATCHED_IMAGE = "registry.example/llama-server:patched"

pytestmark = [pytest.mark.redis]


def detector_wrote(workdir: Path, help_text: str) -> Path:
    """The help file as the pod's detector init container leaves it."""
    workdir.mkdir(parents=True)
    help_file = workdir / "llama-server-help.txt"
    help_file.write_text(help_text)
    return help_file


@contextlib.asynccontextmanager
async def agent_serving(workdir: Path, help_text: str, model_file: Path | None = None) -> AsyncIterator[int]:
    """A real agent on a free loopback port whose detector wrote `help_text` (and which reads the model's
    metadata from `model_file`, when given); yields the port."""
    help_file = detector_wrote(workdir, help_text)
    settings = AgentSettings(snapshot_dir=workdir / "snapshots", model_sha256="c" * 64, slots=2,
                             server_help_file=help_file, pod_name=workdir.name,
                             **({"model_file": model_file} if model_file is not None else {}))
    async with httpx.AsyncClient() as http:
        # The pod's token: its namespace's, derived from the operator's master token.
        app = create_app(settings, llama=NoServer(), http=http, registry=CollectorRegistry(),
                         token=namespace_token(TOKEN, NS))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            for _ in range(250):
                if server.started:
                    break
                await asyncio.sleep(0.02)
            assert server.started, "agent did not start"
            yield port
        finally:
            server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)


async def realize_pod(api: KubeEmulator, name: str, deploy: dict[str, Any], agent_port: int) -> None:
    """Create the pod the Deployment's current template describes, Running and Ready at 127.0.0.1."""
    template = deploy["spec"]["template"]
    spec = dict(template["spec"])
    spec["containers"] = [
        {**c, "ports": [{**p, "containerPort": agent_port} if p["name"] == "agent" else p
                        for p in c.get("ports") or []]}
        for c in spec["containers"]
    ]
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": template["metadata"]["labels"],
                         "annotations": template["metadata"].get("annotations", {})},
            "spec": spec}
    resp = await api.post(f"/api/v1/namespaces/{NS}/pods", json=body)
    assert resp.status == 201, await resp.text()
    status = {"phase": "Running", "podIP": "127.0.0.1", "startTime": "2030-01-01T00:00:00Z",
              "conditions": [{"type": "Ready", "status": "True"}]}
    resp = await api.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json={"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


def server_args(api: KubeEmulator) -> list[str]:
    deploy = obj(api, DEPLOYMENTS, "tiny")
    return list(container(deploy, "llama-server")["args"]) if deploy else []


def image_features(api: KubeEmulator) -> dict[str, Any] | None:
    return ((obj(api, FLEETS, "tiny") or {}).get("status") or {}).get("imageFeatures")


async def test_auto_attach_turns_on_when_a_pod_agent_reports_the_image_supports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, any_redis_url: str) -> None:
    """auto, kvUnified unset: off (per-slot streams) while unknown; a pod's agent reports --slot-attach and
    --cache-prefix; status records them for the image; the Deployment is re-rendered with both flags
    over one KV pool sized for the head once (server) and --attach --kv-unified (agent); membership
    says which pods really run with them; a new image drops the record and the flags until its own
    pods report."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    redis_url = any_redis_url  # one Redis, and a Redis Cluster: the operator writes to either
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS], redis_url=redis_url,
                                    index_prefix=prefix, agent_token=TOKEN, reconcile_interval_s=0.3,
                                    prefix_interval_s=5.0)
        async with (
            running_operator(settings),
            agent_serving(tmp_path / "tiny-0", PATCHED_HELP) as port0,
            agent_serving(tmp_path / "tiny-1", PATCHED_HELP) as port1,
        ):
            await create(api, fleet_manifest(image=PATCHED_IMAGE, replicas=1, contextPerSlot=4096,
                                             prefixSharing={"headTokens": 3000}))
            first = await eventually(lambda: obj(api, DEPLOYMENTS, "tiny"), what="deployment")
            pod_spec = first["spec"]["template"]["spec"]
            detector = next(c for c in pod_spec["initContainers"] if c["name"] == "detect-features")
            assert detector["image"] == PATCHED_IMAGE and "/app/llama-server" in detector["command"]
            assert "--slot-attach" not in server_args(api), "auto must stay off while the image is unknown"
            unknown = server_args(api)
            assert "-no-kvu" in unknown and unknown[unknown.index("-c") + 1] == "8192"
            assert first["spec"]["template"]["metadata"]["annotations"][L.ATTACH] == "false"

            await realize_pod(api, "tiny-0", first, port0)
            record = await eventually(
                lambda: (image_features(api) or {}).get("known") and image_features(api),
                what="status.imageFeatures")
            assert record["image"] == PATCHED_IMAGE and record["pod"] == "tiny-0"
            assert record["slotAttach"] is True and record["cachePrefix"] is True
            args = await eventually(lambda: "--slot-attach" in server_args(api) and server_args(api),
                                    what="deployment re-rendered with --slot-attach")
            assert "--cache-prefix" in args and "-kvu" in args
            assert args[args.index("-c") + 1] == str(3000 + 2 * (4096 - 3000))  # the head once, 2 slots
            deploy = obj(api, DEPLOYMENTS, "tiny")
            assert deploy is not None
            assert {"--attach", "--kv-unified"} <= set(container(deploy, "agent")["args"])
            assert deploy["spec"]["template"]["metadata"]["annotations"][L.ATTACH] == "true"
            # The status is patched after the Deployment is applied: wait for it too.
            def attached() -> dict[str, Any] | None:
                st = (obj(api, FLEETS, "tiny") or {}).get("status") or {}
                return st if st.get("attach") else None

            status = await eventually(attached, what="status.attach")
            assert status["attach"] is True and status["cachePrefix"] is True

            # The old pod runs without the flag, a pod of the new template with it: membership tells apart.
            await patch_spec(api, "llamafleets", "tiny", {"replicas": 2})
            await realize_pod(api, "tiny-1", deploy, port1)
            client = connect(redis_url)
            try:
                async def attach_by_pod() -> dict[str, tuple[bool, bool]] | None:
                    members = await membership.read_members(client, NS, "tiny", prefix=prefix)
                    found = {m.name: (m.attach, m.cache_prefix) for m in members}
                    return found if len(found) == 2 else None

                assert await eventually(attach_by_pod, what="membership of both pods") == {
                    "tiny-0": (False, False), "tiny-1": (True, True)}
            finally:
                await client.aclose()

            # Another image: the record no longer applies, auto is off again until its pods report.
            await patch_spec(api, "llamafleets", "tiny", {"image": "registry.example/llama-server:upstream"})
            await eventually(lambda: "--slot-attach" not in server_args(api) and image_features(api) is None,
                             what="flags off and record dropped after the image changed")
            assert not api.errors


def windowed_model(path: Path, window: int) -> Path:
    """A GGUF holding only the metadata the agent reads: a Gemma 3 architecture with a sliding window."""
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_uint32("gemma3.attention.sliding_window", window)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


async def test_a_sliding_window_model_on_a_patched_image_never_gets_a_unified_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """The pod's agent reports the image's flags and, in the same answer, its model's sliding window:
    the fleet is re-rendered with --cache-prefix but without --slot-attach, on per-slot streams (a
    unified pool without attach made every token attend over every slot's cells)."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS], redis_url=redis_url,
                                    index_prefix=f"t{uuid.uuid4().hex[:8]}", agent_token=TOKEN,
                                    reconcile_interval_s=0.3, prefix_interval_s=5.0)
        model = windowed_model(tmp_path / "gemma.gguf", 512)
        agent = agent_serving(tmp_path / "tiny-0", PATCHED_HELP, model)
        async with running_operator(settings), agent as port:
            await create(api, fleet_manifest(image=PATCHED_IMAGE, replicas=1, contextPerSlot=4096))
            first = await eventually(lambda: obj(api, DEPLOYMENTS, "tiny"), what="deployment")
            await realize_pod(api, "tiny-0", first, port)
            record = await eventually(
                lambda: (image_features(api) or {}).get("known") and image_features(api),
                what="status.imageFeatures")
            assert record["slotAttach"] is True and record["slidingWindow"] == 512
            args = await eventually(lambda: "--cache-prefix" in server_args(api) and server_args(api),
                                    what="deployment re-rendered with --cache-prefix")
            assert "--slot-attach" not in args and "-no-kvu" in args
            deploy = obj(api, DEPLOYMENTS, "tiny")
            assert deploy is not None and "--attach" not in container(deploy, "agent")["args"]
            assert not api.errors

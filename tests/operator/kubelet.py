"""A test "kubelet" (and ReplicaSet controller): realizes the operator's Deployments as real local pods.

For each Deployment in the emulated API it keeps `spec.replicas` pods: it creates the Pod object (owned by
the Deployment, labels and annotations from the template), starts a real llama-server with exactly the
container's rendered arguments (model path, host, port and snapshot folder swapped for local ones) and
the snapshot agent beside it (in-process under uvicorn, with the fleet's KV settings from `podspec`, and
`await_required` as the operator's pods need), then reports the pod Running with podIP 127.0.0.1 and its
real ports in the container port list. Ready follows the agent's `/ready`, like the rendered readiness
probe. It records, at the moment each pod first turns Ready, which snapshots its agent held.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core import podspec
from llamafleet_core.agent_client import AgentClient
from llamafleet_core.agent_tokens import namespace_token
from llamafleet_core.crd.models import LlamaFleetSpec
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.networks import LOOPBACK_NETWORKS
from llamafleet_local.llama_process import LlamaServerProcess
from llamafleet_local.redis_server import free_port
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kmock_support import KubeEmulator
from tests.operator.operator_bed import DEPLOYMENTS, FLEETS, NS, PODS, fleet_manifest, obj, running_operator

MAX_PODS = 2  # llama-servers per test on this machine


class RenderedServer(LlamaServerProcess):
    """A llama-server started with the pod's rendered argv rather than the test defaults."""

    argv: list[str]

    def command(self) -> list[str]:
        return [str(self.binary), *self.argv]


def local_args(rendered: list[str], *, model: Path, port: int, snapdir: Path) -> list[str]:
    """The container's args with the in-pod paths and port replaced by local ones (pure)."""
    swap = {"-m": str(model), "--host": "127.0.0.1", "--port": str(port), "--slot-save-path": str(snapdir)}
    out = list(rendered)
    for i, arg in enumerate(out[:-1]):
        if arg in swap:
            out[i + 1] = swap[arg]
    return out


@dataclass
class LocalPod:
    name: str
    server: RenderedServer
    agent_port: int
    uvicorn: uvicorn.Server
    task: asyncio.Task[None]
    agent: AgentClient
    ready: bool = False
    held_when_ready: list[str] | None = None


@dataclass
class Kubelet:
    api: KubeEmulator
    binary: Path
    model: Path
    workdir: Path
    http: httpx.AsyncClient
    token: str
    pods: dict[str, LocalPod] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def agent_token(self) -> str:
        """What the pod's agent-token Secret would hold: the namespace's token, derived from the master
        the operator holds (`token`)."""
        return namespace_token(self.token, NS)

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # keep the node alive; the test reads `errors`
                self.errors.append(repr(exc))
            await asyncio.sleep(0.2)

    async def tick(self) -> None:
        for (res, ns, name), deploy in list(self.api.objects.items()):
            if res != DEPLOYMENTS or deploy.deleted or ns != NS:
                continue
            await self._scale(name, deploy.raw)
        for name in list(self.pods):
            if obj(self.api, PODS, name) is None:
                await self._stop(self.pods.pop(name))
        for pod in list(self.pods.values()):
            await self._report(pod)

    async def _scale(self, deploy_name: str, deploy: dict[str, Any]) -> None:
        mine = sorted(n for n in self.pods if n.startswith(f"{deploy_name}-"))
        want = min(int(deploy["spec"]["replicas"]), MAX_PODS)
        for i in range(want):
            name = f"{deploy_name}-{i}"
            if name not in mine:
                await self._start(name, deploy)
        for name in mine[want:]:
            await self.api.delete(f"/api/v1/namespaces/{NS}/pods/{name}")

    async def _start(self, name: str, deploy: dict[str, Any]) -> None:
        fleet_name = deploy["metadata"]["labels"]["llamafleet.io/fleet"]
        fleet = obj(self.api, FLEETS, fleet_name)
        assert fleet is not None
        spec = LlamaFleetSpec.model_validate(fleet["spec"])
        template = deploy["spec"]["template"]
        containers = template["spec"]["containers"]
        server_c = next(c for c in containers if c["name"] == "llama-server")
        snapdir = self.workdir / name / "snapshots"
        snapdir.mkdir(parents=True, exist_ok=True)
        port, agent_port = free_port(), free_port()
        server = RenderedServer(binary=self.binary, model=self.model, workdir=self.workdir / name, port=port)
        server.argv = local_args(server_c["args"], model=self.model, port=port, snapdir=snapdir)
        await asyncio.to_thread(server.start)
        kv = podspec.kv_settings(spec)
        settings = AgentSettings(
            llama_url=server.url, snapshot_dir=snapdir, model_file=self.model, model_name=spec.model.name,
            cache_type_k=str(kv["cache_type_k"]), cache_type_v=str(kv["cache_type_v"]),
            flash_attn=str(kv["flash_attn"]), kv_unified="-kvu" in server_c["args"], slots=spec.slots,
            budget_bytes=podspec.snapshot_budget_bytes(spec), pod_name=name, await_required=True,
            peer_networks=list(LOOPBACK_NETWORKS),  # every "pod" of this kubelet is on loopback
        )
        app = create_app(settings, llama=LlamaClient(server.url, self.http), http=self.http,
                         registry=CollectorRegistry(), token=self.agent_token)
        uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=agent_port, log_level="warning"))
        task = asyncio.create_task(uv.serve())
        for _ in range(250):
            if uv.started:
                break
            await asyncio.sleep(0.02)
        pod_spec = dict(template["spec"])
        pod_spec["containers"] = [_with_port(c, {"http": port, "agent": agent_port}) for c in containers]
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": template["metadata"]["labels"],
                         "annotations": template["metadata"].get("annotations", {}),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": deploy["metadata"]["name"],
                                              "uid": deploy["metadata"]["uid"], "controller": True}]},
            "spec": pod_spec,
        }
        resp = await self.api.post(f"/api/v1/namespaces/{NS}/pods", json=body)
        assert resp.status == 201, await resp.text()
        agent = AgentClient(f"http://127.0.0.1:{agent_port}", self.http, self.agent_token)
        self.pods[name] = LocalPod(name, server, agent_port, uv, task, agent)
        await self._report(self.pods[name])

    async def _report(self, pod: LocalPod) -> None:
        body = await pod.agent.readiness()
        ready = bool(body.get("ready"))
        if ready and not pod.ready and pod.held_when_ready is None:
            pod.held_when_ready = [m.name for m in await pod.agent.list()]
        pod.ready = ready
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        current = obj(self.api, PODS, pod.name)
        if current is None:
            return
        status = current.get("status") or {}
        started = status.get("startTime") or now
        flag = "True" if ready else "False"
        want = {
            "phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1", "startTime": started,
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "ContainersReady", "status": flag},
                           {"type": "Ready", "status": flag}],
            "containerStatuses": [{"name": c, "ready": ready if c == "agent" else True, "restartCount": 0,
                                   "state": {"running": {"startedAt": started}}}
                                  for c in ("llama-server", "agent")],
        }
        if all(status.get(k) == v for k, v in want.items()):
            return
        await self.api.patch(f"/api/v1/namespaces/{NS}/pods/{pod.name}/status", json={"status": want},
                             headers={"Content-Type": "application/merge-patch+json"})

    async def _stop(self, pod: LocalPod) -> None:
        pod.uvicorn.should_exit = True
        # uvicorn's task may end cancelled (its lifespan); either way it is over.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(pod.task, 10)
        await asyncio.to_thread(pod.server.stop)

    async def close(self) -> None:
        for pod in list(self.pods.values()):
            await self._stop(pod)
        self.pods.clear()


def _with_port(container: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    out = dict(container)
    out["ports"] = [{**p, "containerPort": ports.get(p["name"], p["containerPort"])}
                    for p in container.get("ports") or []]
    return out


@contextlib.asynccontextmanager
async def running_kubelet(api: KubeEmulator, *, binary: Path, model: Path, workdir: Path,
                          token: str) -> Any:
    async with httpx.AsyncClient(timeout=60.0) as http:
        node = Kubelet(api, binary, model, workdir, http, token)
        task = asyncio.create_task(node.run())
        try:
            yield node
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await node.close()



@contextlib.asynccontextmanager
async def operated_node(api: KubeEmulator, settings: OperatorSettings, *, binary: Path, model: Path,
                        workdir: Path, token: str) -> Any:
    """A one-node cluster: this kubelet running pods with `binary` and `model`, and the operator with
    `settings`; yields the kubelet."""
    async with (
        running_kubelet(api, binary=binary, model=model, workdir=workdir, token=token) as node,
        running_operator(settings),
    ):
        yield node


def tiny_dense_fleet(model: Path, **spec: Any) -> dict[str, Any]:
    """A one-pod, one-thread fleet manifest of the tiny dense model in `model`'s folder (a hostPath the
    operator's settings must allow); `spec` overrides or adds fields."""
    return fleet_manifest(**{"replicas": 1, "threads": 1, **spec, "model": {
        "name": "tiny-dense", "file": "tiny-dense.gguf", "source": {"hostPath": str(model.parent)}}})

"""The operator, run in-process by kopf against the kmock emulator, and helpers to drive and watch it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from llamafleet_operator import cli
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kmock_support import KubeEmulator, kubeconfig

T = TypeVar("T")
NS = "llm"
FLEETS = kmock.resource("llamafleet.io/v1alpha1/llamafleets")
PREFIXES = kmock.resource("llamafleet.io/v1alpha1/sharedprefixes")
DEPLOYMENTS = kmock.resource("apps/v1/deployments")
PODS = kmock.resource("v1/pods")


@contextlib.asynccontextmanager
async def emulated_api(tmp_path: Path) -> AsyncIterator[tuple[KubeEmulator, str]]:
    """The emulator on a loopback port, and a kubeconfig file pointing at it."""
    async with KubeEmulator() as api, kmock.Server(api) as server:
        path = tmp_path / "kubeconfig"
        path.write_text(kubeconfig(str(server.url).rstrip("/")))
        resp = await api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}})
        assert resp.status == 201, await resp.text()
        yield api, str(path)


class Operator:
    """One operator process-equivalent: `start()` and `stop()` it to emulate restarts."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        self._stop = asyncio.Event()
        args = argparse.Namespace(peering=None, priority=0, liveness=None)
        self._task = asyncio.create_task(cli.run(args, self.settings, self._stop))
        await asyncio.sleep(0.3)
        if self._task.done():
            self._task.result()  # surface a start-up failure

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(self._task, 20)
        finally:
            self._task = None


@contextlib.asynccontextmanager
async def running_operator(settings: OperatorSettings) -> AsyncIterator[Operator]:
    op = Operator(settings)
    await op.start()
    try:
        yield op
    finally:
        await op.stop()


async def eventually(probe: Callable[[], T | Awaitable[T | None] | None], timeout: float = 20.0,
                     what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if asyncio.iscoroutine(value):
                value = await value
            last = value
        except (KeyError, TypeError, IndexError, AssertionError) as exc:
            last = exc
            value = None
        if value:
            return value  # type: ignore[return-value]
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def obj(api: KubeEmulator, resource: Any, name: str, namespace: str = NS) -> dict[str, Any] | None:
    """The stored object (a deep copy), or None when absent or deleted."""
    key = (resource, namespace, name)
    if key not in api.objects or api.objects[key].deleted:
        return None
    return copy.deepcopy(api.objects[key].raw)


def fleet_manifest(name: str = "tiny", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "tiny-qwen2", "file": "tiny-qwen2.gguf",
                  "source": {"url": "https://models.example/tiny-qwen2.gguf"}},
        "image": "llamafleet/llama-server:cpu",
        "replicas": 2,
        "slots": 2,
    }
    return {"apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet",
            "metadata": {"name": name, "namespace": NS}, "spec": {**base, **spec}}


async def create(api: KubeEmulator, manifest: dict[str, Any]) -> dict[str, Any]:
    kind = manifest["kind"]
    plural = {"LlamaFleet": "llamafleets", "SharedPrefix": "sharedprefixes"}[kind]
    namespace = manifest["metadata"].get("namespace") or NS
    resp = await api.post(f"/apis/llamafleet.io/v1alpha1/namespaces/{namespace}/{plural}", json=manifest)
    assert resp.status == 201, await resp.text()
    return dict(await resp.json())


async def patch_spec(api: KubeEmulator, plural: str, name: str, spec: dict[str, Any]) -> None:
    resp = await api.patch(f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/{plural}/{name}",
                           json={"spec": spec}, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


async def delete(api: KubeEmulator, path: str) -> None:
    resp = await api.delete(path)
    assert resp.status == 200, await resp.text()


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False)

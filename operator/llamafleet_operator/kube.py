"""The one place that talks to the Kubernetes API (kubernetes-asyncio), with plain dicts in and out.

Every object the operator renders is a dict, so this wrapper goes through the generic `ApiClient.call_api`
rather than the typed per-kind APIs: one code path for core kinds and custom resources alike, and no
model round trip that could drop fields the typed models do not know.

Writes of children use server-side apply (`application/apply-patch+yaml`, one field manager, `force`):
apply is idempotent by construction, needs no exists-then-create, and removes fields the operator stops
rendering. Status uses a merge patch on the status subresource; pod conditions (the readiness gate) use
server-side apply on `pods/status`, where `conditions` merge by type and the kubelet's stay intact.
"""

from __future__ import annotations

import os
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

Obj = dict[str, Any]

FIELD_MANAGER = "llamafleet-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
# Kinds the operator reads or writes -> plural (the path segment).
PLURALS = {
    "Pod": "pods", "Service": "services", "ConfigMap": "configmaps", "Secret": "secrets",
    "Deployment": "deployments", "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets", "NetworkPolicy": "networkpolicies",
    "LlamaFleet": "llamafleets", "SharedPrefix": "sharedprefixes",
}


class KubeError(RuntimeError):
    """An API answer other than success; `status` is the HTTP status (0 when nothing answered)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    tail = f"/{name}" if name else ""
    return f"{prefix}{ns}/{PLURALS[kind]}{tail}"


def default_kubeconfig(explicit: str | None = None) -> str | None:
    """The kubeconfig to use: explicit, else none in a pod (service account), else $KUBECONFIG or ~/.kube.

    Read at call time: kubernetes clients compute their default path when imported, which is too early
    for a process (or a test) that sets KUBECONFIG afterwards.
    """
    if explicit:
        return explicit
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


async def load_configuration(kubeconfig: str | None) -> client.Configuration:
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


class Kube:
    """Apply, get, list, delete and status writes; collaborators get one of these, never a raw client."""

    def __init__(self, api: client.ApiClient, field_manager: str = FIELD_MANAGER) -> None:
        self._api = api
        self.field_manager = field_manager

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, field_manager: str = FIELD_MANAGER) -> Kube:
        """In-cluster credentials, or the given kubeconfig file (read now, not at import)."""
        return cls(client.ApiClient(await load_configuration(kubeconfig)), field_manager)

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, method: str, url: str, *, query: list[tuple[str, str]] | None = None,
                    body: Any = None, content_type: str | None = None) -> Obj:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            result = await self._api.call_api(
                url, method, query_params=query or [], header_params=headers, body=body,
                response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"], _return_http_data_only=True, _request_timeout=30,
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.body or exc.reason)) from exc
        return dict(result or {})

    async def apply(self, manifest: Obj) -> Obj:
        """Server-side apply of a whole object; returns what the server stored."""
        meta = manifest["metadata"]
        url = path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return await self._call("PATCH", url, query=query, body=manifest, content_type=APPLY)

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return await self._call("GET", path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str | None,
                   selector: dict[str, str] | None = None) -> list[Obj]:
        query = []
        if selector:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.items()))))
        answer = await self._call("GET", path(api_version, kind, namespace), query=query)
        return [dict(item) for item in answer.get("items") or []]

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete (background propagation: the garbage collector removes what it owned); False if gone."""
        try:
            await self._call("DELETE", path(api_version, kind, namespace, name),
                             body={"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def patch_status(self, api_version: str, kind: str, namespace: str | None, name: str,
                           status: Obj) -> Obj:
        """Merge `status` into the object's status subresource."""
        url = path(api_version, kind, namespace, name) + "/status"
        return await self._call("PATCH", url, body={"status": status}, content_type=MERGE)

    async def apply_pod_condition(self, namespace: str, name: str, condition: Obj) -> Obj:
        """Set one pod condition (by type) with server-side apply on `pods/status`."""
        url = path("v1", "Pod", namespace, name) + "/status"
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "status": {"conditions": [condition]}}
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return await self._call("PATCH", url, query=query, body=body, content_type=APPLY)

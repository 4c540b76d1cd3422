"""A kmock Kubernetes emulator that kopf and the operator can run against.

kmock 0.8's `KubernetesEmulator` stores objects as plain merged dicts. kopf and a level-based operator need
more of the API server's behaviour than that, so this subclass adds (each one found missing by running
kopf against it; see measured.md):

- server-set metadata: `uid`, `creationTimestamp`, a cluster-wide increasing `resourceVersion` on every
  write, `generation` that increases on changes outside metadata and status, and the namespace from the URL;
- the status subresource: writes to `/status` change only `status`, writes to the object never touch it;
- server-side apply (`application/apply-patch+yaml`): creates a missing object, otherwise replaces every
  field except status and server-set metadata. With one field manager (the operator) that is what SSA
  does: fields the manager stops sending are removed;
- label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`) on lists and watches;
- `kind`, `apiVersion` and a real `resourceVersion` on lists;
- finalizers and `deletionTimestamp`, and the garbage collector: deleting an object deletes the objects
  whose ownerReferences name its uid (what kube-controller-manager does in the background);
- the 256 KiB limit on all of an object's annotations together (422 Invalid, as the API server answers);
- the resources the operator touches, declared for discovery (core, apps, policy, networking, the CRDs).
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import dicts, enums, k8s, rendering

APPLY = "application/apply-patch+yaml"
NAMESPACES = re.compile(r"/api/v1/namespaces(?:/([^/]+))?(?:/(status))?")
SERVER_META = ("uid", "creationTimestamp", "resourceVersion", "generation", "deletionTimestamp",
               "finalizers", "managedFields")

# (group/version/plural, kind, namespaced, subresources)
RESOURCES: tuple[tuple[str, str, bool, tuple[str, ...]], ...] = (
    ("v1/namespaces", "Namespace", False, ("status",)),
    ("v1/pods", "Pod", True, ("status",)),
    ("v1/services", "Service", True, ("status",)),
    ("v1/configmaps", "ConfigMap", True, ()),
    ("v1/secrets", "Secret", True, ()),
    ("v1/events", "Event", True, ()),
    ("events.k8s.io/v1/events", "Event", True, ()),
    ("apps/v1/deployments", "Deployment", True, ("status", "scale")),
    ("apps/v1/statefulsets", "StatefulSet", True, ("status", "scale")),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True, ("status",)),
    ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True, ()),
    ("llamafleet.io/v1alpha1/llamafleets", "LlamaFleet", True, ("status", "scale")),
    ("llamafleet.io/v1alpha1/sharedprefixes", "SharedPrefix", True, ("status",)),
)
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
# apimachinery's TotalAnnotationSizeLimitB: keys and values of all annotations, in bytes.
ANNOTATIONS_LIMIT = 256 * 1024


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _requirements(selector: str) -> list[tuple[str, str, frozenset[str]]]:
    """A Kubernetes label selector as (key, operator, values) requirements."""
    parts = [p.strip() for p in re.split(r",(?![^()]*\))", selector) if p.strip()]
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for part in parts:
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part):
            reqs.append((m.group(1), m.group(2), frozenset(v.strip() for v in m.group(3).split(","))))
        elif m := re.fullmatch(r"([^!=\s]+)\s*(!=|==|=)\s*(\S*)", part):
            reqs.append((m.group(1), "notin" if m.group(2) == "!=" else "in", frozenset({m.group(3)})))
        elif part.startswith("!"):
            reqs.append((part[1:].strip(), "absent", frozenset()))
        else:
            reqs.append((part, "present", frozenset()))
    return reqs


def _holds(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
    if op == "in":
        return labels.get(key) in values
    if op == "notin":
        return labels.get(key) not in values
    return (key in labels) == (op == "present")


def matches(selector: str | None, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(_holds(labels, *req) for req in _requirements(selector))


class KubeEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """kmock's emulator with the API-server behaviour kopf and the operator rely on (module docstring)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = 0
        for key, kind, namespaced, subs in RESOURCES:
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS, subresources=set(subs))

    # -- requests ------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's entry point, with namespace paths parsed (kmock 0.8 fails on `/api/v1/namespaces`)."""
        await raw_request.read()
        try:
            request = await _parse(raw_request, len(self._requests))
            self._requests.append(request)
            return await self._handle(request)
        except Exception as exc:
            # API errors (404, 409) are answers; anything else is an emulator bug a test should see.
            if self._errors and not isinstance(exc, k8s.KubernetesError):
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    # -- reads ---------------------------------------------------------------------------------

    def _live(self, request: rendering.Request) -> list[dict[str, Any]]:
        selector = request.params.get("labelSelector")
        out = []
        for (res, ns, name), obj in self.objects.items():
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and ns != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            if matches(selector, obj.raw):
                out.append(obj.raw)
        return out

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        async with self._lock:
            items = self._live(request)
        kind = self.resources[request.resource].kind or "Object"
        group, version = request.resource.group, request.resource.version
        return {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        assert request.resource is not None
        selector = request.params.get("labelSelector")
        async with self._lock:
            since = int(request.params.get("resourceVersion") or 0)
            # Replay what changed after the list the client started from (all of it without one).
            events = [{"type": "ADDED", "object": o} for o in self._live(request)
                      if int(o["metadata"].get("resourceVersion", 0)) > since]
        for event in events:
            yield event
        async for event in self._buses[request.resource]:
            obj = event.get("object", {})
            meta = obj.get("metadata", {})
            if request.namespace is not None and meta.get("namespace") != request.namespace:
                continue
            if request.name is not None and meta.get("name") != request.name:
                continue
            if matches(selector, obj):
                yield event

    # -- writes --------------------------------------------------------------------------------

    def _stamp(self, body: dict[str, Any]) -> None:
        self._rv += 1
        body["metadata"]["resourceVersion"] = str(self._rv)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None or request.action not in (
                enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE):
            return await kmock.RawHandler._handle(self, request)  # type: ignore[no-any-return]
        if request.action == enums.action.DELETE and request.name is None:
            raise k8s.KubernetesError(status=405, reason="MethodNotAllowed", message="no collection deletes")
        async with self._lock:
            if request.action == enums.action.CREATE:
                status, body = 201, await self._create(request.resource, request.namespace, request.data)
            elif request.action == enums.action.UPDATE:
                status, body = 200, await self._update(request)
            else:
                status, body = 200, await self._delete(request.resource, request.namespace, request.name)
        return aiohttp.web.json_response(body, status=status)

    async def _create(self, res: Any, namespace: str | None, data: Any) -> dict[str, Any]:
        body: dict[str, Any] = dict(data or {})
        meta = body["metadata"] = dict(body.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if self.resources[res].namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key = (res, meta.get("namespace"), meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise k8s.KubernetesObjectConflictError()
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        _check_annotations(body)
        self._stamp(body)
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body
        await self._buses[res].put({"type": "ADDED", "object": body})
        return body

    async def _update(self, request: rendering.Request) -> dict[str, Any]:
        res, ns, name = request.resource, request.namespace, request.name
        key = (res, ns, name)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        exists = key in self.objects and not self.objects[key].deleted
        if not exists:
            if content_type == APPLY and request.subresource is None:
                return await self._create(res, ns, request.data)
            raise k8s.KubernetesObjectNotFoundError()
        old: dict[str, Any] = self.objects[key].raw
        has_status = "status" in self.resources[res].subresources
        if content_type == APPLY and request.subresource == "status":
            # Applied status: conditions are a list-map keyed by type, other fields merge.
            status = dict(old.get("status") or {})
            applied = dict((request.data or {}).get("status") or {})
            by_type = {c["type"]: c for c in status.get("conditions") or []}
            by_type.update({c["type"]: c for c in applied.pop("conditions", [])})
            status.update(applied)
            status["conditions"] = list(by_type.values())
            new = {**old, "status": status}
        elif content_type == APPLY:
            new = {k: v for k, v in dict(request.data).items() if k != "status"}
            new["metadata"] = {**{k: v for k, v in (request.data.get("metadata") or {}).items()},
                               **{k: old["metadata"][k] for k in SERVER_META if k in old["metadata"]},
                               "name": name}
            if ns is not None:
                new["metadata"]["namespace"] = ns
            if "status" in old:
                new["status"] = old["status"]
        else:
            patch = request.data
            if isinstance(patch, dict) and has_status:
                # The status subresource: /status writes change status only, object writes never do.
                if request.subresource == "status":
                    patch = {"status": patch.get("status")} if "status" in patch else {}
                else:
                    patch = {k: v for k, v in patch.items() if k != "status"}
            new = dict(dicts.patch_dict(old, patch))
        if _outside_meta(old) != _outside_meta(new):
            new["metadata"] = {**new["metadata"], "generation": int(old["metadata"].get("generation", 1)) + 1}
        if new == old:
            return old
        _check_annotations(new)
        self._stamp(new)
        self.objects[key].create(new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(key, new)
        else:
            await self._buses[res].put({"type": "MODIFIED", "object": new})
        return new

    async def _delete(self, res: Any, ns: str | None, name: str | None) -> dict[str, Any]:
        key = (res, ns, name)
        if key not in self.objects or self.objects[key].deleted:
            raise k8s.KubernetesObjectNotFoundError()
        obj: dict[str, Any] = self.objects[key].raw
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        if meta.get("finalizers"):
            new = {**obj, "metadata": {**meta, "deletionTimestamp": _now()}}
            self._stamp(new)
            self.objects[key].create(new)
            await self._buses[res].put({"type": "MODIFIED", "object": new})
            return new
        await self._remove(key, obj)
        return obj

    async def _remove(self, key: Any, obj: dict[str, Any]) -> None:
        """Delete for good, then collect the garbage: objects owned by this one go too."""
        self.objects[key].delete()
        await self._buses[key[0]].put({"type": "DELETED", "object": obj})
        uid = obj["metadata"].get("uid")
        for child_key in self._owned_by(uid):
            child = self.objects[child_key]
            if not child.deleted:
                await self._delete(*child_key)

    def _owned_by(self, uid: str | None) -> Iterable[Any]:
        for key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            refs = (obj.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                yield key


async def _parse(raw: aiohttp.web.BaseRequest, id_: int) -> rendering.Request:
    match = NAMESPACES.fullmatch(raw.path)
    if match is None:
        return await rendering.Request._parse(raw, id=id_)  # type: ignore[no-any-return]
    data = None
    body = await raw.read()
    if body:
        data = await raw.json()
    method = enums.method(raw.method)
    name = match.group(1)
    if method == enums.method.GET:
        action = enums.action.WATCH if raw.query.get("watch") == "true" else (
            enums.action.FETCH if name else enums.action.LIST)
    else:
        action = {"POST": enums.action.CREATE, "PATCH": enums.action.UPDATE,
                  "DELETE": enums.action.DELETE}.get(raw.method)
    return rendering.Request(
        id=id_, raw_request=raw, url=raw.url, method=raw.method, params=dict(raw.query),
        headers=dict(raw.headers), cookies=dict(raw.cookies), data=data, body=body, text=body.decode(),
        action=action, resource=kmock.resource("v1/namespaces"), namespace=None, name=name or None,
        subresource=match.group(2),
    )


def _check_annotations(obj: dict[str, Any]) -> None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    size = sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > ANNOTATIONS_LIMIT:
        raise k8s.KubernetesError(status=422, reason="Invalid", message=(
            f"metadata.annotations: Too long: may not be more than {ANNOTATIONS_LIMIT} bytes"))


def _outside_meta(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def kubeconfig(url: str) -> str:
    """A kubeconfig (YAML text) pointing at the emulator, as `KUBECONFIG` expects it."""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters:\n- name: kmock\n  cluster:\n    server: {url}\n"
        "users:\n- name: kmock\n  user:\n    token: kmock-token\n"
        "contexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: kmock\n    namespace: default\n"
    )

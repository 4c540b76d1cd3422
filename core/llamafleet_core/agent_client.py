"""Client of the snapshot agent, for the router and the operator.

It lives in core because the router and the operator must not import the agent package (the components
are independent by import rules); it speaks only HTTP and the shared manifest types. The `httpx.AsyncClient`
is borrowed from the owner, like `LlamaClient`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from pydantic import BaseModel, Field

from llamafleet_core.snapshot import Fingerprint, RestoreResult, SnapshotManifest


class RequiredStatus(BaseModel):
    """The snapshots a pod must hold before it is ready (`GET|PUT /v1/required`).

    `declared` is false until someone set the list; with `--await-required` the pod is not ready
    before that, so a pod created a moment ago cannot be routed to before its warmer got to it.
    """

    required: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    declared: bool = False
    satisfied: bool = True


class AgentError(RuntimeError):
    """The agent refused or failed: `reason` is its own explanation, `kind` its category.

    `status` is the HTTP code, or None when the agent could not be reached at all.
    """

    def __init__(self, reason: str, status: int | None = None, kind: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.kind = kind


class AgentClient:
    def __init__(self, base_url: str, http: httpx.AsyncClient, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = http
        self._headers = {"Authorization": f"Bearer {token}"}

    async def _call(self, method: str, path: str, json: Any = None, wait: float | None = 60.0) -> Any:
        try:
            resp = await self._http.request(
                method, self.base_url + path, json=json, headers=self._headers, timeout=wait
            )
        except httpx.HTTPError as exc:
            raise AgentError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                error = resp.json().get("error", {})
                reason, kind = str(error.get("reason", resp.text)), str(error.get("kind", ""))
            except (ValueError, AttributeError):
                reason, kind = resp.text, ""
            raise AgentError(reason, resp.status_code, kind)
        return resp.json()

    async def fingerprint(self) -> Fingerprint:
        return Fingerprint.model_validate(await self._call("GET", "/v1/fingerprint"))

    async def info(self) -> dict[str, Any]:
        """`GET /v1/info`: the pod, its fleet, and its llama-server's `features` as the agent read them."""
        data = await self._call("GET", "/v1/info", wait=10.0)
        return dict(data) if isinstance(data, dict) else {}

    async def save(
        self,
        slot: int,
        name: str,
        *,
        pinned: bool = False,
        blocks: list[str] | None = None,
        block_chars: int = 0,
        tokens: list[int] | None = None,
        n_chars: int = 0,
        text_hash: str = "",
    ) -> SnapshotManifest:
        """Save `slot` as snapshot `name`; with `tokens`, the agent refuses if the slot holds others.
        `n_chars`/`text_hash` record the exact prefix text it holds, for whoever rebuilds the index."""
        body: dict[str, Any] = {"slot": slot, "name": name, "pinned": pinned, "block_chars": block_chars,
                                "n_chars": n_chars, "text_hash": text_hash}
        if blocks is not None:
            body["blocks"] = blocks
        if tokens is not None:
            body["tokens"] = tokens
        return SnapshotManifest.model_validate(await self._call("POST", "/v1/snapshots/save", body, None))

    async def pull(self, name: str, source: str, *, pinned: bool | None = None) -> SnapshotManifest:
        """Have this agent fetch and verify `name` from the agent at `source` (a base URL)."""
        body: dict[str, Any] = {"name": name, "source": source}
        if pinned is not None:
            body["pinned"] = pinned
        return SnapshotManifest.model_validate(await self._call("POST", "/v1/snapshots/pull", body, None))

    async def restore(self, name: str, slot: int) -> RestoreResult:
        data = await self._call("POST", f"/v1/snapshots/{name}/restore", {"slot": slot}, None)
        return RestoreResult.model_validate(data)

    async def get(self, name: str) -> SnapshotManifest:
        return SnapshotManifest.model_validate(await self._call("GET", f"/v1/snapshots/{name}"))

    async def list(self) -> list[SnapshotManifest]:
        data = await self._call("GET", "/v1/snapshots")
        return [SnapshotManifest.model_validate(m) for m in data["snapshots"]]

    async def delete(self, name: str) -> None:
        await self._call("DELETE", f"/v1/snapshots/{name}")

    async def set_required(self, names: Iterable[str]) -> RequiredStatus:
        """Replace the list of snapshots this pod must hold to be ready (always the whole set)."""
        body: dict[str, Any] = {"snapshots": sorted(set(names))}
        return RequiredStatus.model_validate(await self._call("PUT", "/v1/required", body))

    async def required(self) -> RequiredStatus:
        return RequiredStatus.model_validate(await self._call("GET", "/v1/required"))

    async def readiness(self) -> dict[str, Any]:
        """The body of `GET /ready` (it names missing required snapshots), whatever its status code."""
        try:
            resp = await self._http.get(self.base_url + "/ready", headers=self._headers, timeout=5.0)
        except httpx.HTTPError as exc:
            return {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
        try:
            body = resp.json()
        except ValueError:
            body = {}
        result: dict[str, Any] = body if isinstance(body, dict) else {}
        result["ready"] = resp.status_code == 200 and bool(result.get("ready", True))
        return result

    async def ready(self) -> bool:
        try:
            resp = await self._http.get(self.base_url + "/ready", headers=self._headers, timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

"""A fake snapshot agent for the orchestration tests, served by aiohttp on loopback beside its pod's fake.

A fake for orchestration only: snapshots are the token pieces of a slot kept in a dict (no file, no
checksum, no signature), and a restore puts them back into its `FakeLlama`'s slot. It answers what the
gateway calls (`core/llamafleet_core/agent_client.py`: /ready, fingerprint, list, save, pull, restore,
get, delete) with the real agent's bodies (`llamafleet_agent.bodies`) and error shape, and refuses a
save whose tokens are not what the slot holds, as the real one does. Every call is recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from llamafleet_agent.bodies import PullBody, RestoreBody, SaveBody
from llamafleet_core.snapshot import Fingerprint, RestoreResult, SnapshotManifest, tokens_sha256
from tests.router.orchestration.pods import Call, FakeLlama

FINGERPRINT = Fingerprint(model_sha256="ab" * 32, build="b1-fake", n_slots=4)


@dataclass
class Stored:
    manifest: SnapshotManifest
    pieces: list[str]


def _error(status: int, kind: str, reason: str) -> web.Response:
    return web.json_response({"error": {"kind": kind, "reason": reason}}, status=status)


@dataclass
class FakeAgent:
    pod: FakeLlama
    token: str
    peers: dict[str, FakeAgent]  # every fake agent of the test by base URL, for pulls
    name: str = "pod"
    url: str = ""
    snapshots: dict[str, Stored] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    refuse_restores: bool = False  # answer every restore with llama-server's refusal
    _saves_open: asyncio.Event = field(default_factory=asyncio.Event)
    _save_waiting: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._saves_open.set()

    # --- the test's handles ---

    def hold_saves(self) -> None:
        """From now on slot saves wait until `release_saves` (the build is held at its first save)."""
        self._saves_open.clear()
        self._save_waiting.clear()

    async def save_held(self) -> None:
        """Until a save waits at the held gate."""
        await asyncio.wait_for(self._save_waiting.wait(), 30)

    def release_saves(self) -> None:
        self._saves_open.set()

    def saved(self, prefix: str = "") -> list[str]:
        """Names saved through this agent, in order."""
        return [c.body["name"] for c in self.calls if c.path == "/v1/snapshots/save"
                and c.body["name"].startswith(prefix)]

    def restores(self) -> list[str]:
        return [c.path.split("/")[3] for c in self.calls if c.path.endswith("/restore")]

    # --- handlers ---

    async def _body(self, request: web.Request, model: type[BaseModel]) -> Any:
        body = await request.json()
        self.calls.append(Call(request.method, request.path, body))
        return model.model_validate(body)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/ready" and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "auth", "missing or wrong bearer token")
        response: web.StreamResponse = await handler(request)
        return response

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def fingerprint(self, request: web.Request) -> web.Response:
        return web.json_response(FINGERPRINT.model_dump(mode="json"))

    async def list(self, request: web.Request) -> web.Response:
        self.calls.append(Call("GET", request.path, None))
        return web.json_response({"snapshots": [s.manifest.model_dump(mode="json")
                                                for s in self.snapshots.values()]})

    async def get(self, request: web.Request) -> web.Response:
        stored = self.snapshots.get(request.match_info["name"])
        if stored is None:
            return _error(404, "not_found", "no such snapshot")
        return web.json_response(stored.manifest.model_dump(mode="json"))

    async def delete(self, request: web.Request) -> web.Response:
        self.calls.append(Call("DELETE", request.path, None))
        self.snapshots.pop(request.match_info["name"], None)
        return web.json_response({"deleted": True})

    async def save(self, request: web.Request) -> web.Response:
        body: SaveBody = await self._body(request, SaveBody)
        while not self._saves_open.is_set():
            self._save_waiting.set()
            await self._saves_open.wait()
        held = self.pod.slot_ids(body.slot)
        if body.tokens is not None and body.tokens != held:
            return _error(409, "tokens", f"slot {body.slot} holds {len(held)} other tokens")
        pieces = list(self.pod.slots[body.slot])
        digest = hashlib.sha256("".join(pieces).encode()).hexdigest()
        manifest = SnapshotManifest(
            name=body.name, fingerprint=FINGERPRINT, n_tokens=len(held), tokens_sha256=tokens_sha256(held),
            blocks=body.blocks or [], block_chars=body.block_chars, n_chars=body.n_chars,
            text_hash=body.text_hash, model=self.pod.model, size=len(pieces) * 16, sha256=digest,
            pinned=body.pinned, source_pod=self.name)
        self.snapshots[body.name] = Stored(manifest, pieces)
        return web.json_response(manifest.model_dump(mode="json"))

    async def pull(self, request: web.Request) -> web.Response:
        body: PullBody = await self._body(request, PullBody)
        peer = self.peers.get(body.source.rstrip("/"))
        stored = peer.snapshots.get(body.name) if peer is not None else None
        if stored is None:
            return _error(404, "not_found", "the peer has no such snapshot")
        self.snapshots[body.name] = Stored(stored.manifest, list(stored.pieces))
        return web.json_response(stored.manifest.model_dump(mode="json"))

    async def restore(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body: RestoreBody = await self._body(request, RestoreBody)
        if self.refuse_restores:
            return _error(502, "llama", "llama-server refused the restore")
        stored = self.snapshots.get(name)
        if stored is None:
            return _error(404, "not_found", "no such snapshot")
        self.pod.slots[body.slot] = list(stored.pieces)
        result = RestoreResult(name=name, slot=body.slot, n_tokens=len(stored.pieces), verify_ms=0.1,
                               restore_ms=0.1, total_ms=0.2)
        return web.json_response(result.model_dump(mode="json"))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/v1/fingerprint", self.fingerprint)
        app.router.add_get("/v1/snapshots", self.list)
        app.router.add_post("/v1/snapshots/save", self.save)
        app.router.add_post("/v1/snapshots/pull", self.pull)
        app.router.add_get("/v1/snapshots/{name}", self.get)
        app.router.add_delete("/v1/snapshots/{name}", self.delete)
        app.router.add_post("/v1/snapshots/{name}/restore", self.restore)
        return app

"""The agent's HTTP API (a Starlette app). See the package docstring for the routes.

Only the router and the operator may call it: every route but the probes (`/health`, `/ready`) and
`/metrics` needs the shared bearer token, compared in constant time. JSON bodies are capped (1 MiB by
default) before they are parsed.

`/metrics` is open so that Prometheus can scrape it without the token (the token can pull, restore and
delete on every pod of its namespace; a scraper must never hold it). It holds no secret and no name:
counters by operation, outcome and refusal kind, byte totals, snapshot counts and the server's feature
flags; never a snapshot name, a prompt hash, a peer address or a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from llamafleet_agent import files
from llamafleet_agent.bodies import PullBody, RequiredBody, RestoreBody, SaveBody, error_response, read_json
from llamafleet_agent.features import FeatureReport
from llamafleet_agent.metrics import AgentMetrics
from llamafleet_agent.required import Requirements
from llamafleet_agent.restore_check import RestoreCheck
from llamafleet_agent.service import LlamaLike, SnapshotService
from llamafleet_agent.settings import AgentSettings
from llamafleet_agent.store import Refused, SnapshotStore
from llamafleet_core.gguf_meta import model_resume_kind, model_sliding_window

# Probes: the kubelet cannot send the shared token, and readiness reveals nothing sensitive. Metrics:
# Prometheus holds no token either, and they hold no secret (module docstring).
PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics"})


class BearerAuth:
    """Pure ASGI middleware: 401 unless `Authorization: Bearer <token>` matches (constant-time)."""

    def __init__(self, app: ASGIApp, token: str, metrics: AgentMetrics) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                self.metrics.refusals.labels("auth").inc()
                response = error_response(401, "auth", "missing or wrong bearer token")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _HeldStream(StreamingResponse):
    """A streaming response that releases what it holds (file, in-use mark) however the send ends.

    A generator's own `finally` is not enough: if the peer hangs up before the first chunk, the
    generator never starts and its cleanup never runs, which would pin the snapshot forever.
    """

    def __init__(self, stack: contextlib.ExitStack, content: AsyncIterator[bytes], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._stack = stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stack.close()


def create_app(
    settings: AgentSettings,
    *,
    llama: LlamaLike,
    http: httpx.AsyncClient,
    registry: CollectorRegistry,
    token: str | None = None,
) -> Starlette:
    """Build the agent app; `token` overrides the settings' token (tests), else `resolved_token()`."""
    token = token or settings.resolved_token()
    metrics = AgentMetrics(registry)
    settings.snapshot_dir.mkdir(parents=True, exist_ok=True)
    store = SnapshotStore(settings.snapshot_dir, settings.budget_bytes,
                          signing_key=settings.resolved_signing_key(token),
                          on_untrusted=lambda reason: metrics.untrusted.labels(reason).inc())
    service = SnapshotService(settings, store, llama, http, metrics, token)
    requirements = Requirements(store, await_declaration=settings.await_required)
    requirements.load()
    service.required = requirements.names
    report = FeatureReport(settings.server_help_file, metrics)
    limit = settings.max_body_bytes
    # Read once: the router needs it to predict what a slot of this pod can resume from (gguf_meta.py).
    resume = model_resume_kind(settings.model_file, swa_full=settings.swa_full)
    restores = RestoreCheck(llama, model_sliding_window(settings.model_file, swa_full=settings.swa_full),
                            lambda: store.temp_path("probe"))
    # The model's own window, --swa-full or not: llama-server attaches no slot of such a model, so the
    # operator keeps its pods on per-slot KV streams (a unified pool would only widen every attention).
    window = model_sliding_window(settings.model_file)

    def operation(op: str) -> Callable[[Callable[[Request], Awaitable[Any]]], Callable[..., Any]]:
        """Turn a handler's result or `Refused` into a response, counting outcomes and time per op."""

        def wrap(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    result = await handler(request)
                except Refused as exc:
                    metrics.refusals.labels(exc.kind).inc()
                    metrics.ops.labels(op, "refused").inc()
                    return error_response(exc.status, exc.kind, exc.reason)
                except OSError as exc:
                    metrics.ops.labels(op, "error").inc()
                    return error_response(500, "io", f"{type(exc).__name__}: {exc}")
                metrics.ops.labels(op, "ok").inc()
                metrics.duration.labels(op).observe(time.perf_counter() - started)
                if isinstance(result, Response):
                    return result
                if isinstance(result, BaseModel):
                    return Response(result.model_dump_json(), media_type="application/json")
                return JSONResponse(result)

            return endpoint

        return wrap

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def current_fingerprint() -> Any:
        with contextlib.suppress(Refused):
            return await service.fingerprint()
        return None

    async def ready(request: Request) -> Response:
        llama_ok = await llama.health()
        digest_ok = service.digest_ready()
        fingerprint = await current_fingerprint() if llama_ok and digest_ok else None
        required = requirements.status(fingerprint)
        if llama_ok:
            restores.start()
        probed = restores.report  # not ready while pending: the gateway must know before it routes here
        ok = (llama_ok and digest_ok and fingerprint is not None and required.satisfied
              and probed.state != "pending")
        body = {"ready": ok, "llama": llama_ok, "model_digest": digest_ok, "declared": required.declared,
                "required": required.required, "missing": required.missing, "resume": resume,
                "restores": probed.state}
        return JSONResponse(body, status_code=200 if ok else 503)

    counted: list[tuple[object, float]] = []  # (folder state, when) of the last count of the folder

    def count_folder() -> None:
        # Unauthenticated: the manifests are read again only when the folder changed (its mtime or its
        # names, a listing without reading a file), or `metrics_refresh_s` passed.
        with os.scandir(settings.snapshot_dir) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(".json"))
        state = (os.stat(settings.snapshot_dir).st_mtime_ns, hash(tuple(names)))
        now = time.monotonic()
        if counted and counted[0][0] == state and now - counted[0][1] < settings.metrics_refresh_s:
            return
        manifests = store.list_all()
        metrics.stored_count.set(len(manifests))
        metrics.stored_bytes.set(sum(m.size for m in manifests))
        pinned = [m for m in manifests if m.pinned]
        metrics.pinned_count.set(len(pinned))
        metrics.pinned_bytes.set(sum(m.size for m in pinned))
        counted[:] = [(state, now)]

    async def metrics_endpoint(request: Request) -> Response:
        count_folder()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @operation("fingerprint")
    async def fingerprint(request: Request) -> Any:
        return await service.fingerprint()

    @operation("info")
    async def info(request: Request) -> Any:
        return {"pod": settings.pod_name, "fleet": settings.fleet, "model": settings.model_name,
                "attach": settings.attach, "features": report.to_json(),
                "slotContext": await service.slot_context(), "restores": restores.report.to_json(),
                "slidingWindow": window}

    @operation("list")
    async def list_snapshots(request: Request) -> Any:
        return {"snapshots": [m.model_dump(mode="json") for m in store.list_all()]}

    @operation("get")
    async def get_snapshot(request: Request) -> Any:
        return store.read_manifest(request.path_params["name"])

    @operation("delete")
    async def delete_snapshot(request: Request) -> Any:
        name = request.path_params["name"]
        if not store.delete(name):
            raise Refused("not_found", f"no snapshot {name}", 404)
        return {"deleted": name}

    @operation("required")
    async def get_required(request: Request) -> Any:
        return requirements.status(await current_fingerprint())

    @operation("required")
    async def put_required(request: Request) -> Any:
        b = await read_json(request, RequiredBody, limit)
        requirements.set(b.snapshots)
        service.required = requirements.names
        return requirements.status(await current_fingerprint())

    @operation("save")
    async def save(request: Request) -> Any:
        b = await read_json(request, SaveBody, limit)
        await restores.settled()  # the probe's slot round trip is over before a save touches a slot
        return await service.save(
            b.slot, b.name, pinned=b.pinned, blocks=b.blocks, block_chars=b.block_chars, tokens=b.tokens,
            n_chars=b.n_chars, text_hash=b.text_hash,
        )

    @operation("pull")
    async def pull(request: Request) -> Any:
        b = await read_json(request, PullBody, limit)
        return await service.pull(b.name, b.source, pinned=b.pinned)

    @operation("restore")
    async def restore(request: Request) -> Any:
        b = await read_json(request, RestoreBody, limit)
        await restores.settled()
        return await service.restore(request.path_params["name"], b.slot)

    @operation("serve")
    async def serve_file(request: Request) -> Any:
        name = request.path_params["name"]
        manifest = store.read_manifest(name)  # only complete snapshots are served
        stack = contextlib.ExitStack()
        stack.enter_context(store.in_use(name))
        try:
            fd = files.open_nofollow(store.bin_path(name))
        except files.SymlinkRefused as exc:
            stack.close()
            raise Refused("symlink", f"snapshot file {name}.bin is a symlink") from exc
        except FileNotFoundError as exc:
            stack.close()
            raise Refused("not_found", f"snapshot file {name}.bin is missing", 404) from exc
        fh = stack.enter_context(os.fdopen(fd, "rb"))
        size = os.fstat(fd).st_size

        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            while chunk := await asyncio.to_thread(fh.read, files.CHUNK):
                sent += len(chunk)
                yield chunk
            metrics.bytes.labels("served").inc(sent)

        headers = {"content-length": str(size), "x-snapshot-sha256": manifest.sha256}
        return _HeldStream(stack, chunks(), media_type="application/octet-stream", headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store.cleanup_temps()
        report.load()
        service.start_digest()  # hash the model while llama-server is still loading it
        yield
        await restores.close()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/v1/fingerprint", fingerprint, methods=["GET"]),
        Route("/v1/info", info, methods=["GET"]),
        Route("/v1/snapshots", list_snapshots, methods=["GET"]),
        Route("/v1/required", get_required, methods=["GET"]),
        Route("/v1/required", put_required, methods=["PUT"]),
        Route("/v1/snapshots/save", save, methods=["POST"]),
        Route("/v1/snapshots/pull", pull, methods=["POST"]),
        Route("/v1/snapshots/{name}", get_snapshot, methods=["GET"]),
        Route("/v1/snapshots/{name}", delete_snapshot, methods=["DELETE"]),
        Route("/v1/snapshots/{name}/file", serve_file, methods=["GET"]),
        Route("/v1/snapshots/{name}/restore", restore, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = service
    app.state.restores = restores
    app.state.store = store
    app.add_middleware(BearerAuth, token=token, metrics=metrics)
    return app

"""The supervisor's `metrics_port`: `/metrics` and `/health` of every worker at once.

Each scrape asks every worker on its private port at the same time, with a deadline under the
readiness probe's timeout (the chart's probe reads `/metrics`). A worker that does not answer in time,
answers with an error or sends text that does not parse is left out of that scrape and counted
(`llamafleet_router_worker_scrape_failures_total`): the scrape itself always answers 200, since one
worker restarting is no reason to fail the pod's readiness while the others serve.

`/health` is 200 when every worker answers its own `/health` with 200, and lists each worker's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llamafleet_router.supervisor.merge import merge_expositions
from llamafleet_router.supervisor.metrics import SupervisorMetrics

#: Under the chart's readiness probe timeout (3 s), which reads the merged /metrics.
SCRAPE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class WorkerAddress:
    """Where one worker answers now: its pid and private metrics port (None while it is not running)."""

    name: str
    pid: int | None
    port: int | None


async def ask(
    http: httpx.AsyncClient, worker: WorkerAddress, path: str, timeout_s: float
) -> httpx.Response | None:
    """The worker's answer to GET `path` on its private port; None when it gave none in time."""
    if worker.port is None:
        return None
    try:
        return await http.get(f"http://127.0.0.1:{worker.port}{path}", timeout=timeout_s)
    except httpx.HTTPError:
        return None


async def ask_all(
    http: httpx.AsyncClient, workers: Sequence[WorkerAddress], path: str, timeout_s: float
) -> list[httpx.Response | None]:
    return list(await asyncio.gather(*(ask(http, w, path, timeout_s) for w in workers)))


def _health_entry(worker: WorkerAddress, answer: httpx.Response | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"worker": worker.name, "pid": worker.pid}
    if answer is None:
        entry["status"] = "unreachable" if worker.port is not None else "not running"
        return entry
    try:
        body = answer.json()
    except ValueError:
        body = None
    entry["status"] = body.get("status", answer.status_code) if isinstance(body, dict) else answer.status_code
    entry["http_status"] = answer.status_code
    if isinstance(body, dict):
        entry["health"] = body
    return entry


def front_app(
    workers: Callable[[], Sequence[WorkerAddress]], metrics: SupervisorMetrics, http: httpx.AsyncClient,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> Starlette:
    """The metrics port's app; `workers()` says where the workers answer at the time of each request."""

    async def merged_metrics(request: Request) -> Response:
        now = list(workers())
        answers = await ask_all(http, now, "/metrics", timeout_s)
        texts: dict[str, str] = {}
        for worker, answer in zip(now, answers, strict=True):
            if answer is not None and answer.status_code == 200:
                texts[worker.name] = answer.text
            else:
                metrics.scrape_failures.labels(worker.name).inc()
        merged = merge_expositions(texts)
        for name in merged.unparsable:
            metrics.scrape_failures.labels(name).inc()
        # After the merge: this scrape's own failures are in what it returns.
        own = generate_latest(metrics.registry).decode()
        return Response(merged.text + own, media_type=CONTENT_TYPE_LATEST)

    async def health(request: Request) -> Response:
        now = list(workers())
        answers = await ask_all(http, now, "/health", timeout_s)
        entries = [_health_entry(w, a) for w, a in zip(now, answers, strict=True)]
        ok = bool(now) and all(a is not None and a.status_code == 200 for a in answers)
        body = {"status": "ok" if ok else "unavailable", "workers": entries}
        return JSONResponse(body, status_code=200 if ok else 503)

    return Starlette(routes=[
        Route("/metrics", merged_metrics, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])

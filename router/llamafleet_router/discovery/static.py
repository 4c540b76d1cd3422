"""Static discovery: a configured list of llama-server URLs, each watched by its own polling task.

Per pod, every `poll_interval`:
- while UP: `GET /slots` gives the busy slots (`is_processing`). A connection error (or 503 "loading")
  marks the pod DOWN. If the slot ids or their `n_ctx` changed, the server restarted behind the same URL.
- while DOWN: `GET /health`; on 200, `GET /props` (model name, slot count, chat template, build) and the
  pod is UP again.

Fencing: every DOWN->UP transition (and every detected restart) starts a new epoch, so the pod's uid
`f"{url}@{epoch}"` changes and the old uid is handed to `fence` (the app purges its index entries). A blip
that was not a restart costs some index hints, never a wrong one. Epochs are milliseconds since 1970,
forced to increase, so they also order restarts across router replicas roughly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamafleet_core.llama_client import LlamaClient, LlamaError
from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.discovery.base import FenceHook, PodProps, PodStatus
from llamafleet_router.settings import PodSpec

log = logging.getLogger(__name__)


@dataclass
class _Pod:
    spec: PodSpec
    client: LlamaClient
    up: bool = False
    ref: PodRef | None = None
    props: PodProps | None = None
    busy: frozenset[int] = frozenset()
    shape: tuple[tuple[int, int], ...] | None = None
    first_poll: asyncio.Event = field(default_factory=asyncio.Event)


class StaticDiscovery:
    def __init__(
        self,
        pods: list[PodSpec],
        http: httpx.AsyncClient,
        *,
        poll_interval: float = 1.0,
        model_name: str | None = None,
        fence: FenceHook | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self._pods = [_Pod(spec, LlamaClient(spec.url, http)) for spec in pods]
        self._interval = poll_interval
        self._model_name = model_name
        self._fence = fence
        self._startup_timeout = startup_timeout
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(pod), name=f"discovery {pod.spec.url}") for pod in self._pods
        ]
        if self._pods:
            waits = [asyncio.create_task(pod.first_poll.wait()) for pod in self._pods]
            _, pending = await asyncio.wait(waits, timeout=self._startup_timeout)
            for task in pending:
                task.cancel()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def endpoints(self) -> list[PodStatus]:
        return [self._status(pod) for pod in self._pods]

    def mark_down(self, uid: str) -> None:
        for pod in self._pods:
            if pod.ref is not None and pod.ref.uid == uid and pod.up:
                log.warning("pod marked down", extra={"pod": pod.spec.url, "uid": uid})
                pod.up = False

    async def poll_once(self) -> None:
        """One refresh of every pod (tests drive discovery with it instead of waiting for the loop)."""
        await asyncio.gather(*(self._refresh(pod) for pod in self._pods))

    def _status(self, pod: _Pod) -> PodStatus:
        ref = pod.ref or PodRef(name=pod.spec.url, uid=f"{pod.spec.url}@0", epoch=0)
        endpoint = Endpoint(
            pod=ref,
            url=pod.spec.url,
            model=pod.props.model if pod.props else "",
            n_slots=pod.props.total_slots if pod.props else 0,
            agent_url=pod.spec.agent_url,
            ready=pod.up,
        )
        return PodStatus(endpoint=endpoint, props=pod.props, busy_slots=pod.busy if pod.up else frozenset())

    async def _watch(self, pod: _Pod) -> None:
        while True:
            try:
                await self._refresh(pod)
            except Exception:
                # A malformed answer must not kill the watcher: log it and keep polling.
                log.exception("pod refresh failed", extra={"pod": pod.spec.url})
            pod.first_poll.set()
            await asyncio.sleep(self._interval)

    async def _refresh(self, pod: _Pod) -> None:
        if not pod.up:
            if not await pod.client.health():
                return
            try:
                props = await pod.client.props()
            except LlamaError:
                return
            await self._bring_up(pod, props)
        try:
            slots = await pod.client.slots()
        except LlamaError as exc:
            if exc.status is None or exc.status == 503:
                self._down(pod, str(exc))
            else:
                # 501: started with --no-slots. Routable, but busy slots are unknown.
                pod.busy = frozenset()
            return
        shape = tuple((int(s.get("id", i)), int(s.get("n_ctx") or 0)) for i, s in enumerate(slots))
        if pod.shape is not None and shape != pod.shape:
            log.warning("pod restarted (slot layout changed)", extra={"pod": pod.spec.url})
            try:
                await self._bring_up(pod, await pod.client.props())
            except LlamaError as exc:
                self._down(pod, str(exc))
                return
        pod.shape = shape
        pod.busy = frozenset(int(s.get("id", i)) for i, s in enumerate(slots) if s.get("is_processing"))

    async def _bring_up(self, pod: _Pod, props: dict[str, Any]) -> None:
        old = pod.ref
        # Every router replica must name a pod alike, or replicas could not share index entries: the
        # uid is the pod's URL, and a restart seen by any replica purges the pod's entries (fencing).
        # llama-server exposes no start time; `epoch` only counts the restarts this replica saw.
        epoch = old.epoch + 1 if old is not None else 0
        pod.ref = PodRef(name=pod.spec.url, uid=pod.spec.url, epoch=epoch)
        pod.props = PodProps.from_props(props, self._model_name)
        pod.shape = None
        pod.busy = frozenset()
        pod.up = True
        log.info("pod up", extra={"pod": pod.spec.url, "uid": pod.ref.uid, "model": pod.props.model})
        if old is not None and self._fence is not None:
            await self._fence(old)

    def _down(self, pod: _Pod, reason: str) -> None:
        if pod.up:
            log.warning("pod down", extra={"pod": pod.spec.url, "reason": reason})
        pod.up = False

"""Static discovery: a configured list of llama-server URLs, each watched by its own polling task.

Per pod, every `poll_interval`:
- while UP: `GET /slots` gives the busy slots (`is_processing`). A connection error (or 503 "loading")
  marks the pod DOWN. If the slot ids or their `n_ctx` changed, the server restarted behind the same URL.
  A pod that does not answer `/slots` within `max(3 s, 4 x poll_interval)` is hung (SIGSTOP, a stuck
  GPU): it is marked DOWN too, so traffic moves to the others. (llama-server answers `/slots` between
  two batches, so the bound must stay well above one batch's compute time.)
- while DOWN: `GET /health`; on 200, and when the pod has a snapshot agent, the agent's public `/ready`
  must answer 200 as well (a restarted pod is not routable until it holds its SharedPrefix snapshots
  again); then `GET /props` (model name, slot count, chat template, build) and the pod is UP again.

Fencing: an UP->DOWN transition hands the pod's ref to `fence` at once (the app purges the pod's index
entries: a dead pod's slots and snapshots are hints that can only mislead other replicas and the
scheduler until it returns). Every DOWN->UP transition (and every detected restart) then starts a new
epoch and fences again BEFORE the pod is visible, after the purge started at DOWN has finished: entries
written for the old epoch meanwhile (a request dispatched just before the pod died) go too, and nothing
recorded for the new epoch can be purged by an old fence. The pod's snapshot files are recorded again
when it returns (`snapshots/resync.py` lists them at every new epoch). The uid stays the pod's URL, so
that every router replica names a pod alike. A blip that was not a restart (a pod hung for a moment)
costs some index hints, never a wrong one.
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
from llamafleet_router.background import cancel_and_wait
from llamafleet_router.discovery.base import FenceHook, PodProps, PodStatus
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.proxy.gone import GoneSignal

log = logging.getLogger(__name__)


# What a pod's `PodStatus` is built from. The status is kept until one of these changes: the router keeps
# a pod's scheduling view while its status is the same object (fleet/state.py), and a status built per
# pod per request was most of a large fleet's read (docs/design.md, "Gateway process").
_STATUS_FIELDS = frozenset({"spec", "up", "ref", "props", "busy", "resume_anywhere", "restores"})
_UNSET = object()


@dataclass
class _Pod:
    spec: PodSpec
    client: LlamaClient
    up: bool = False
    ref: PodRef | None = None
    props: PodProps | None = None
    busy: frozenset[int] = frozenset()
    shape: tuple[tuple[int, int], ...] | None = None
    resume_anywhere: bool = True  # from the agent's /ready (gguf_meta.py); pods without agents: True
    restores: bool = True  # the agent's restore probe (agent/restore_check.py) did not find them useless
    first_poll: asyncio.Event = field(default_factory=asyncio.Event)
    purge: asyncio.Task[None] | None = None  # the fence started when the pod went down
    status: PodStatus | None = field(default=None, repr=False, compare=False)  # `StaticDiscovery._status`

    def __setattr__(self, name: str, value: Any) -> None:
        # A poll sets `busy` every second, mostly to what it was: an equal value keeps the status.
        if name in _STATUS_FIELDS and self.__dict__.get(name, _UNSET) != value:
            self.__dict__["status"] = None
        object.__setattr__(self, name, value)


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
        hang_timeout: float | None = None,
        api_key: str | None = None,
    ) -> None:
        self._api_key = api_key  # the pods' own `--api-key`: /slots and /props need it
        self._pods = [_Pod(spec, LlamaClient(spec.url, http, api_key)) for spec in pods]
        self._http = http
        self._gone: dict[str, GoneSignal] = {}
        self._hang_after = hang_timeout or max(3.0, 4 * poll_interval)
        self._interval = poll_interval
        self._model_name = model_name
        self._fence = fence
        self._startup_timeout = startup_timeout
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False

    async def start(self) -> None:
        self._started = True
        self._tasks = {pod.spec.url: self._spawn(pod) for pod in self._pods}
        if self._pods:
            waits = [asyncio.create_task(pod.first_poll.wait()) for pod in self._pods]
            _, pending = await asyncio.wait(waits, timeout=self._startup_timeout)
            for task in pending:
                task.cancel()

    async def stop(self) -> None:
        self._started = False
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancel_and_wait(task)  # a cancel of stop() itself must not be swallowed here
        for pod in self._pods:
            await self._purged(pod)  # a purge under way finishes: the index must not keep a dead pod

    @property
    def urls(self) -> set[str]:
        return {pod.spec.url for pod in self._pods}

    def add(self, spec: PodSpec) -> None:
        """Watch one more pod (a no-op for a URL already watched); polled at once when started."""
        if spec.url in self.urls:
            return
        pod = _Pod(spec, LlamaClient(spec.url, self._http, self._api_key))
        self._pods.append(pod)
        if self._started:
            self._tasks[spec.url] = self._spawn(pod)

    def update(self, spec: PodSpec) -> None:
        """Replace a watched pod's settings (its URL stays): they describe the pod, not its connection."""
        for pod in self._pods:
            if pod.spec.url == spec.url:
                pod.spec = spec

    async def remove(self, url: str) -> None:
        """Stop watching a pod that left the fleet. Its index entries are fenced: the same URL may come
        back later as another pod (a reused IP) starting again at epoch 0."""
        pod = next((p for p in self._pods if p.spec.url == url), None)
        if pod is None:
            return
        self._pods.remove(pod)
        was_up = pod.up
        self._down(pod, "left the fleet")
        if (task := self._tasks.pop(url, None)) is not None:
            await cancel_and_wait(task)
        await self._purged(pod)
        if not was_up and pod.ref is not None and self._fence is not None:
            await self._fence(pod.ref)  # down already, but entries may have been written since

    async def endpoints(self) -> list[PodStatus]:
        return [pod.status or self._status(pod) for pod in self._pods]

    def mark_down(self, uid: str) -> None:
        for pod in self._pods:
            if pod.ref is not None and pod.ref.uid == uid and pod.up:
                log.warning("pod marked down", extra={"pod": pod.spec.url, "uid": uid})
                self._down(pod, "marked down by the proxy")

    def gone(self, uid: str) -> GoneSignal:
        """Set when the pod goes DOWN from now on: requests still waiting for its first byte give up
        and go to another pod instead of hanging with it."""
        event = self._gone.get(uid)
        if event is None:
            event = self._gone[uid] = GoneSignal()
        return event

    async def poll_once(self) -> None:
        """One refresh of every pod (tests drive discovery with it instead of waiting for the loop)."""
        await asyncio.gather(*(self._refresh(pod) for pod in self._pods))

    def _spawn(self, pod: _Pod) -> asyncio.Task[None]:
        return asyncio.create_task(self._watch(pod), name=f"discovery {pod.spec.url}")

    def _status(self, pod: _Pod) -> PodStatus:
        """The status of `pod` built now, and kept on it until what it is built from changes."""
        ref = pod.ref or PodRef(name=pod.spec.url, uid=f"{pod.spec.url}@0", epoch=0)
        endpoint = Endpoint(
            pod=ref,
            url=pod.spec.url,
            model=pod.props.model if pod.props else "",
            n_slots=pod.props.total_slots if pod.props else 0,
            agent_url=pod.spec.agent_url,
            ready=pod.up,
            attach=pod.spec.attach,
            cache_prefix=pod.spec.cache_prefix,
            resume_anywhere=pod.resume_anywhere,
            restores=pod.restores,
        )
        pod.status = PodStatus(endpoint=endpoint, props=pod.props,
                               busy_slots=pod.busy if pod.up else frozenset(), fleet=pod.spec.fleet)
        return pod.status

    async def _watch(self, pod: _Pod) -> None:
        while True:
            try:
                await self._refresh(pod)
            except Exception:
                # A malformed answer must not kill the watcher: log it and keep polling.
                log.exception("pod refresh failed", extra={"pod": pod.spec.url})
            pod.first_poll.set()
            await asyncio.sleep(self._interval)

    async def _agent_ready(self, pod: _Pod) -> bool:
        if pod.spec.agent_url is None:
            return True
        try:
            resp = await self._http.get(pod.spec.agent_url.rstrip("/") + "/ready", timeout=5.0)
        except httpx.HTTPError:
            return False
        if resp.status_code != 200:
            return False
        with contextlib.suppress(ValueError, AttributeError):  # an older agent's body: keep the default
            body = resp.json()
            pod.resume_anywhere = body.get("resume") != "checkpoints"
            pod.restores = body.get("restores") != "unusable"
        return True

    async def _refresh(self, pod: _Pod) -> None:
        if not pod.up:
            if not await pod.client.health() or not await self._agent_ready(pod):
                return
            try:
                props = await pod.client.props()
            except LlamaError:
                return
            await self._bring_up(pod, props)
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the pod answers,
            # and this watcher then outlived `stop()`, polling (and purging) after the app had ended.
            async with asyncio.timeout(self._hang_after):
                slots = await pod.client.slots()
        except TimeoutError:
            self._down(pod, "no answer to /slots in time: the pod hangs")
            return
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
        await self._purged(pod)  # the purge started when it went down ends before the fence below
        if old is not None:
            pod.up = False  # invisible until its old entries are purged
            if self._fence is not None:
                await self._fence(old)
        pod.ref = PodRef(name=pod.spec.url, uid=pod.spec.url, epoch=epoch)
        pod.props = PodProps.from_props(props, self._model_name)
        pod.shape = None
        pod.busy = frozenset()
        pod.up = True
        log.info("pod up", extra={"pod": pod.spec.url, "uid": pod.ref.uid, "model": pod.props.model})

    def _down(self, pod: _Pod, reason: str) -> None:
        was_up = pod.up
        if was_up:
            log.warning("pod down", extra={"pod": pod.spec.url, "reason": reason})
        pod.up = False
        if pod.ref is not None and (event := self._gone.pop(pod.ref.uid, None)) is not None:
            event.set()
        if was_up and pod.ref is not None and self._fence is not None:
            # At once, not when the pod returns (it may never): its entries are gone within a poll.
            pod.purge = asyncio.create_task(self._purge(pod.ref), name=f"purge {pod.spec.url}")

    async def _purge(self, ref: PodRef) -> None:
        assert self._fence is not None
        try:
            await self._fence(ref)
        except Exception:
            # The app's fence handles its own errors; a failing hook must not go unnoticed either.
            log.exception("purging a pod that went down failed", extra={"pod": ref.name})

    async def _purged(self, pod: _Pod) -> None:
        """Wait for the purge started when `pod` went down, if any."""
        task, pod.purge = pod.purge, None
        if task is not None:
            await asyncio.wait({task})  # never raises the task's outcome; our own cancel goes through

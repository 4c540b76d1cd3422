"""The fleet the fault scenarios run on: `llamafleet up` (LocalFleet) with small, fast settings.

Two pods of two slots each, the tiny dense model, one thread per llama-server, a SharedPrefix of a few
thousand characters warmed on both, an embedded (killable) redis-server, restarts on. The gateway's
snapshot flow is turned on with the fleet's agent token (restore-on-miss and first sight), so faults hit
the full request path. Everything listens on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from llamafleet_core import http_pool
from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.prefix import ChatTemplate, chat_identity, prefix_key_bytes
from llamafleet_core.types import SlotRef
from llamafleet_local.up import FleetConfig, LocalFleet, UpOptions, parse_documents
from llamafleet_local.up.pods import LocalPod
from llamafleet_local.up.progress import Reporter
from llamafleet_local.up.supervise import FleetFailed
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.snapshots import SnapshotConfig
from llamafleet_testbed.reliability.client import QUESTIONS, chat_body
from llamafleet_testbed.reliability.outcome import SUCCEEDED, ScenarioResult, Sent, agreement, parse_json

T = TypeVar("T")

FLEET = "rel"
PREFIX = "rules"
SYSTEM = " ".join(
    f"Rule {i}: keep answers short, cite files by path, and never guess a number." for i in range(40))


def fleet_documents(binary: Path | None, *, replicas: int = 2, slots: int = 2,
                    model: str = "tiny-dense", pod_api_key: bool = False) -> list[dict[str, Any]]:
    """`pod_api_key`: the fleet sets `apiKeySecretRef`, so its llama-servers run with `--api-key`."""
    local: dict[str, Any] = {"model": model, "threads": 1}
    if binary is not None:
        local["llamaServer"] = str(binary)
    spec: dict[str, Any] = {
        "model": {"name": model, "file": f"{model}.gguf", "source": {"hostPath": "/models"}},
        "image": "local", "replicas": replicas, "slots": slots, "contextPerSlot": 4096}
    if pod_api_key:
        spec["apiKeySecretRef"] = {"name": "pod-api-key", "key": "api-key"}
    fleet = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet", "metadata": {"name": FLEET},
        "spec": spec, "local": local,
    }
    prefix = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix", "metadata": {"name": PREFIX},
        "spec": {"fleetRef": {"name": FLEET}, "messages": [{"role": "system", "content": SYSTEM}]},
    }
    return [fleet, prefix]


def fleet_config(binary: Path | None, **kwargs: Any) -> FleetConfig:
    return parse_documents(fleet_documents(binary, **kwargs), "reliability fleet", Path.cwd())


@dataclass
class Bed:
    fleet: LocalFleet
    http: httpx.AsyncClient
    log: io.StringIO  # what `up` would have printed on stderr

    @property
    def model(self) -> str:
        return self.fleet.model

    @property
    def url(self) -> str:
        return self.fleet.gateway_url

    @property
    def gateway(self) -> Any:
        return self.fleet.app.state.gateway

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the gateway's samples `name` whose labels include `labels` (0: never counted)."""
        return float(sum(s.value for metric in self.gateway.metrics.registry.collect() for s in metric.samples
                         if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())))

    async def route_agent(self, i: int, agent_url: str) -> None:
        """Have the gateway reach pod `i`'s agent at `agent_url` (a `SlowLink` in front of it), as if
        discovery had been configured so."""
        url = self.pod(i).layout.llama_url
        status = next(p for p in await self.gateway.discovery.endpoints() if p.endpoint.url == url)
        self.gateway.discovery.update(PodSpec(url, agent_url, status.endpoint.attach,
                                                      cache_prefix=status.endpoint.cache_prefix))

    def pod(self, i: int) -> LocalPod:
        return self.fleet.pods[i]

    def body(self, i: int, *, stream: bool = True, max_tokens: int = 12,
             system: str = SYSTEM) -> dict[str, Any]:
        return chat_body(self.model, system, QUESTIONS[i % len(QUESTIONS)], stream=stream,
                         max_tokens=max_tokens)

    async def pod_entries(self, uid: str, chains: Sequence[tuple[str, ...]]) -> int:
        """Index entries naming pod `uid`: its snapshots plus its slots holding any of `chains` (from
        `chains(bodies)`, made once). The reads go together: a scenario polls this to time a purge, and
        one after another on a loaded machine they took seconds, which the purge was then charged."""
        assert self.fleet.index is not None
        index = self.fleet.index.index
        snaps, found = await asyncio.gather(
            _patiently(functools.partial(index.snapshots, self.model, uid)),
            asyncio.gather(*(_patiently(functools.partial(index.lookup, self.model, chain))
                             for chain in chains)))
        return len(snaps) + sum(ref.pod_uid == uid for lookup in found for ref in lookup.slots)

    async def chains(self, bodies: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
        props = (await self.http.get(self.pod(0).layout.llama_url + "/props")).json()
        template = ChatTemplate.from_props(props)
        key = prefix_key_bytes(self.fleet.prefix_key)  # the gateway's hash key
        return [tuple(chat_identity(b, template, model=self.model, key=key).blocks) for b in bodies]

    async def pod_ready(self, i: int) -> bool:
        """Whether the gateway's discovery routes to pod `i` now."""
        url = self.pod(i).layout.llama_url
        return any(p.ready for p in await self.gateway.discovery.endpoints() if p.endpoint.url == url)

    async def references(self, max_tokens: int, system: str = SYSTEM) -> dict[str, str]:
        """Each question's greedy answer computed cold (no prompt cache) on pod 0: what a restore must
        reproduce."""
        return {q: await self.reference(q, max_tokens, system) for q in QUESTIONS}

    async def reference(self, question: str, max_tokens: int, system: str = SYSTEM) -> str:
        body = {**chat_body(self.model, system, question, stream=False, max_tokens=max_tokens),
                "cache_prompt": False}
        resp = await self.http.post(self.pod(0).layout.llama_url + "/v1/chat/completions", json=body)
        return parse_json(resp.content)[1]

    def wrongly_restored(self, results: Sequence[Sent], refs: dict[str, str]) -> int:
        """Answers served after a restore whose text is not the cold run's (a wrong KV state diverges
        from the first token; batching noise never moves half of the answer). A longer answer is
        compared by its start: greedy decoding makes the reference its prefix."""
        def wrong(r: Sent) -> bool:
            ref = refs[QUESTIONS[r.n % len(QUESTIONS)]]
            return agreement(r.text[: len(ref)], ref) < 0.5

        return sum(1 for r in results if r.restored and r.verdict == SUCCEEDED and wrong(r))

    async def slot_holders(self) -> list[tuple[SlotRef, str | None]]:
        """Every slot's lease holder in Redis (a gateway replica's name), None where free."""
        leases = self.fleet.index.leases if self.fleet.index else None
        assert leases is not None
        return [(ref, await leases.holder(ref)) for pod in self.fleet.pods
                for ref in (SlotRef(pod.layout.llama_url, s) for s in range(2))]

    async def held(self) -> dict[str, int]:
        """What is still held: requests the gateway counts in flight, slots its requests hold, and slot
        leases in Redis (of any replica)."""
        leases = self.gateway.leases
        return {"in_flight": self.gateway.in_flight.total(),
                "slots_held": leases.held() if leases is not None else 0,
                "leases": sum(holder is not None for _, holder in await self.slot_holders())}

    async def check_leaks(self, r: ScenarioResult, limit: float = 5.0) -> None:
        """After the workload: nothing may stay held. Bounded wait: the last answers' releases run in
        background tasks."""
        async def clean() -> bool:
            return not any((await self.held()).values())

        settled = await until(clean, limit)
        left = await self.held()
        r.checks["held_after_s"] = None if settled is None else round(settled, 2)
        r.expect(settled is not None, f"still held {limit:.0f}s after the workload: {left}")


@contextlib.asynccontextmanager
async def running_fleet(binary: Path | None, run_dir: Path, *, snapshots: bool = True,
                        ready_timeout: float = 180.0, **kwargs: Any) -> AsyncIterator[Bed]:
    """Start the fleet, wait until it is ready, keep it whole (restarts) while the caller works."""
    log = io.StringIO()
    fleet = LocalFleet(fleet_config(binary, **kwargs),
                       UpOptions(port=0, run_dir=run_dir, restart=True, max_restarts=3, pod_timeout=60.0),
                       Reporter(log))
    async with fleet, http_pool.async_client(timeout=httpx.Timeout(60.0)) as http:
        await fleet.wait_ready(ready_timeout)
        if snapshots:
            fleet.app.state.gateway.enable_snapshots(SnapshotConfig(token=fleet.agent_token,
                                                                    pod_api_key=fleet.pod_api_key))
        stop = asyncio.Event()
        keeper = asyncio.create_task(fleet.run_until(stop), name="supervise")
        try:
            yield Bed(fleet, http, log)
        finally:
            stop.set()
            with contextlib.suppress(FleetFailed, asyncio.CancelledError):
                async with asyncio.timeout(120):
                    await keeper


def kill(pid: int | None, sig: signal.Signals = signal.SIGKILL) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def until(check: Any, limit: float, every: float = 0.05) -> float | None:
    """Seconds until the async `check()` was true, or None after `limit` seconds."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(every)
    return None


async def _patiently(op: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """`op`, asked again when the index timed out: the gateway's index client gives up after 0.5 s (it
    would rather route without the index), and a check run on a loaded two-core machine should not."""
    for attempt in range(attempts):
        try:
            return await op()
        except IndexUnavailable:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")

"""Index outages never fail a request: the router serves on, says so in /health and the gauge, and
returns to prefix-aware routing when the index answers again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.types import Lookup, PromptTags, SlotRef
from llamafleet_router.background import IndexHealth
from llamafleet_router.inprocess import app_client
from llamafleet_router.metrics import RouterMetrics
from tests.router.conftest import AppFactory, chat_body


class FlakyIndex(InMemoryPrefixIndex):
    """The in-memory index, with an outage switch."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def lookup(self, model: str, blocks: Sequence[str], tags: PromptTags | None = None) -> Lookup:
        if self.down:
            raise IndexUnavailable("redis: connection refused")
        return await super().lookup(model, blocks, tags)

    async def record_slot(
        self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int, tags: PromptTags | None = None
    ) -> None:
        if self.down:
            raise IndexUnavailable("redis: connection refused")
        await super().record_slot(model, slot, blocks, n_tokens, tags)

    async def ping(self) -> bool:
        return not self.down


async def test_requests_are_served_and_health_says_degraded_when_index_raises(make_app: AppFactory) -> None:
    index = FlakyIndex()
    app = make_app(index_override=index)
    gateway = app.state.gateway
    gauge = "llamafleet_router_index_degraded"
    async with app_client(app) as client:
        assert (await client.get("/health")).json()["index"] == "ok"
        index.down = True
        responses = [
            await client.post("/v1/chat/completions", json=chat_body(stream=s)) for s in (False, True)
        ]
        await gateway.tasks.drain(5.0)
        health = await client.get("/health")
        degraded_gauge = gateway.metrics.registry.get_sample_value(gauge)
        errors = gateway.metrics.registry.get_sample_value("llamafleet_router_index_errors_total",
                                                           {"op": "record_slot"})
        branches = (await client.get("/metrics")).text
        index.down = False
        for _ in range(100):  # the watcher pings every 50 ms in these tests
            if not gateway.health.degraded:
                break
            await asyncio.sleep(0.02)
        recovered = await client.get("/health")
    assert [r.status_code for r in responses] == [200, 200]
    assert health.status_code == 200 and health.json()["index"] == "degraded"
    assert degraded_gauge == 1
    assert errors == 2
    assert 'branch="degraded_hash"' in branches or 'branch="session_affinity"' in branches
    assert recovered.json()["index"] == "ok"
    assert gateway.metrics.registry.get_sample_value(gauge) == 0


async def test_an_index_that_restarted_empty_between_two_pings_has_its_snapshots_recorded_again() -> None:
    """Pings that all answer cannot see a Redis restart (no persistence) that fell between two of them;
    the index's instance can: a new one calls the same hooks as a recovery, once, and the first one seen
    calls none."""

    class Restarting(InMemoryPrefixIndex):
        life = "a"

        async def instance(self) -> str:
            return self.life

    index = Restarting()
    health = IndexHealth(index, RouterMetrics(CollectorRegistry()), interval=1.0)
    calls: list[str] = []
    health.on_recovered.append(lambda: calls.append(index.life))
    assert await health.check() and calls == []
    assert await health.check() and calls == []
    index.life = "b"
    assert await health.check() and calls == ["b"]
    assert await health.check() and calls == ["b"]
    assert not health.degraded

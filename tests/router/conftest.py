"""Router app fixtures: a fake fleet, the real in-memory index and scheduler, the app in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_router.app import create_app
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.settings import RouterSettings
from tests.router.fakes import FakeFleet, FakePod

POD_A = "http://pod-a:8080"
POD_B = "http://pod-b:8080"


@pytest.fixture
def fleet() -> FakeFleet:
    return FakeFleet(FakePod(POD_A), FakePod(POD_B))


@pytest.fixture
def index() -> InMemoryPrefixIndex:
    return InMemoryPrefixIndex()


@pytest.fixture
def leases() -> InMemorySlotLeases:
    return InMemorySlotLeases()


@pytest.fixture
async def http(fleet: FakeFleet) -> AsyncIterator[httpx.AsyncClient]:
    async with fleet.client() as client:
        yield client


AppFactory = Callable[..., Starlette]


@pytest.fixture
def make_app(
    fleet: FakeFleet, index: InMemoryPrefixIndex, leases: InMemorySlotLeases, http: httpx.AsyncClient
) -> AppFactory:
    """Build an app over the fake fleet; keyword arguments override settings or collaborators."""

    def build(
        *, scheduler: Any = None, index_override: Any = None, readiness: Any = None, fenced: bool = False,
        **overrides: Any
    ) -> Starlette:
        settings = RouterSettings(
            pods=list(fleet.pods), poll_interval=30.0, index_ping_interval=0.05, **overrides
        )
        specs = [PodSpec.parse(u) for u in fleet.pods]
        # fenced: the app's own purge hook, as in production (a pod going down loses its index entries)
        discovery: Any = (
            (lambda client, fence: StaticDiscovery(specs, http, poll_interval=30.0, fence=fence)) if fenced
            else StaticDiscovery(specs, http, poll_interval=30.0))
        return create_app(
            settings,
            index=index_override or index,
            leases=leases,
            discovery=discovery,
            scheduler=scheduler,
            registry=CollectorRegistry(),
            http=http,
            readiness=readiness,
        )

    return build


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "hello"},
        ],
        **extra,
    }

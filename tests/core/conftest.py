"""Clients of the test Redis for the index tests: redis-py to look at what the index wrote, and the
index's own client to run it on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from llamafleet_core.index.redis_conn import connect, connect_index
from llamafleet_core.index.resp import IndexClient


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis | aioredis.RedisCluster]:
    """redis-py, to look at what the index wrote."""
    c = connect(redis_url)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
async def rc(redis_url: str) -> AsyncIterator[IndexClient]:
    """The index's own client."""
    c = connect_index(redis_url)
    try:
        yield c
    finally:
        await c.aclose()

"""The head-family part of the PrefixIndex contract (`record_head`, `family`), for both backends.

A family's heads and divergence points are what lets a later day's first session find where it parts
from the heads the fleet built before, after every slot was lost (see router/snapshots/divergence.py)."""

from __future__ import annotations

from llamafleet_core.index.base import FAMILY_HEADS, FAMILY_POINTS, merge_family
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.types import DivergencePoint, HeadFamily, HeadRecord
from tests.core.test_index_contract import MODEL, Backend, backend, chain, text

__all__ = ["backend"]  # the fixture, run for the memory and the Redis backend


def head(seed: str, n_blocks: int = 6) -> HeadRecord:
    body = text(n_blocks, seed)
    return HeadRecord(tuple(chain(body)), len(body), seed)


async def test_an_unknown_family_is_empty(backend: Backend) -> None:
    assert await backend.index.family(MODEL, "nothing") == HeadFamily()


async def test_heads_and_points_come_back_newest_first_without_duplicates(backend: Backend) -> None:
    idx = backend.index
    day1, day2 = head("day1"), head("day2")
    p1, p2 = DivergencePoint(40, 8, "h1"), DivergencePoint(24, 24, "h2")
    await idx.record_head(MODEL, "fam", day1)
    await backend.elapse(0.01)
    await idx.record_head(MODEL, "fam", day2, [p1, p2])
    assert await idx.family(MODEL, "fam") == HeadFamily((day2, day1), (p1, p2))
    await backend.elapse(0.01)
    await idx.record_head(MODEL, "fam", day1, [p2])  # seen again: first again, nothing doubled
    assert await idx.family(MODEL, "fam") == HeadFamily((day1, day2), (p2, p1))
    assert await idx.family("another-model", "fam") == HeadFamily()
    assert await idx.family(MODEL, "another-family") == HeadFamily()


async def test_a_family_keeps_only_its_newest_heads_and_points(backend: Backend) -> None:
    idx = backend.index
    heads = [head(f"h{i}", 2) for i in range(FAMILY_HEADS + 3)]
    points = [DivergencePoint(8 * i, 100 - i, f"t{i}") for i in range(FAMILY_POINTS + 5)]
    for i, h in enumerate(heads):
        await idx.record_head(MODEL, "fam", h, points[2 * i: 2 * i + 2])
        await backend.elapse(0.005)
    got = await idx.family(MODEL, "fam")
    assert got.heads == tuple(reversed(heads))[:FAMILY_HEADS]
    newest_points = [p for i in reversed(range(len(heads))) for p in points[2 * i: 2 * i + 2]]
    assert got.points == tuple(newest_points[:FAMILY_POINTS])


async def test_a_family_expires_with_the_snapshot_ttl(backend: Backend) -> None:
    idx = backend.make_index(snapshot_ttl_s=0.3)
    await idx.record_head(MODEL, "fam", head("a"), [DivergencePoint(8, 8, "x")])
    assert (await idx.family(MODEL, "fam")).heads
    await backend.elapse(0.5)
    assert await idx.family(MODEL, "fam") == HeadFamily()


def test_merge_family_is_the_pure_rule_both_backends_keep() -> None:
    a, b = head("a"), head("b")
    p, q = DivergencePoint(1, 2, "p"), DivergencePoint(3, 4, "q")
    merged = merge_family(HeadFamily((a,), (p,)), b, [q, q], max_heads=1, max_points=5)
    assert merged == HeadFamily((b,), (q, p))


async def test_the_instance_is_stable_until_the_index_loses_its_entries(backend: Backend) -> None:
    """Every caller sees the same instance; a Redis that restarted empty (here: its instance key gone,
    as after a restart without persistence or a flush) answers with a new one, once, for everyone."""
    idx, other = backend.index, backend.make_index()
    first = await idx.instance()
    assert first and await idx.instance() == first
    if backend.name != "redis":
        return
    assert await other.instance() == first  # another gateway replica on the same Redis agrees
    assert isinstance(idx, RedisPrefixIndex)
    await idx._client.execute("DEL", f"{idx._prefix}:instance")
    renewed = await other.instance()
    assert renewed != first and await idx.instance() == renewed

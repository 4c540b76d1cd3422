"""`degraded-hash` scorer: consistent hashing with bounded load, used only while the index is down.

Type: `degraded-hash`
Parameters:
  - `replication` (int, default 100): virtual nodes per pod on the ring.
  - `load_factor` (float > 1, default 1.25): a pod is skipped on the ring walk while its load
    (in_flight + queue_depth) exceeds `load_factor * (total + 1) / n` (KubeAI CHWBL).
  - `fallback_blocks` (int, default 4): when the prompt has no session-prefix blocks, hash this many
    leading blocks instead.
Consumes: `index_available` (from `prefix-lookup`): 0 everywhere while it is true (or absent).
Score: 1.0 for every slot of the first pod on the ring walk from the key that is within bounded load;
0 elsewhere. A `PodScorer` (asked once per pod) and a `GatedScorer` (skipped while the index is up).

The key is the hash of the session prefix blocks (tools + system prompt): sessions sharing a prefix
meet on one pod without any shared state, and every router replica computes the same answer from the
same live pods, so the fleet keeps most of its prefix locality when Redis is down. The ring holds pod
NAMES (not uids), so a pod restarted under the same name keeps its arc. Pure; the ring is cached per
set of pod names.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, ClassVar

from pydantic import Field

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.framework import (
    INDEX_AVAILABLE,
    Candidate,
    CycleState,
    EndpointState,
    PluginHandle,
    PluginParams,
    PluginSpec,
    SchedRequest,
)
from llamafleet_router.scheduling.plugins.filters.bounded_load import load_threshold


class DegradedHashParams(PluginParams):
    replication: int = Field(default=100, ge=1, le=10_000)
    load_factor: float = Field(default=1.25, gt=1.0)
    fallback_blocks: int = Field(default=4, ge=1)


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=64)
def _ring(names: tuple[str, ...], replication: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    points = sorted((_h64(f"{name}#{i}"), name) for name in names for i in range(replication))
    return tuple(p for p, _ in points), tuple(n for _, n in points)


def ring_walk(key: str, names: Sequence[str], replication: int) -> list[str]:
    """Distinct pod names in ring order starting at `key`'s position. Deterministic and pure."""
    hashes, owners = _ring(tuple(sorted(set(names))), replication)
    if not hashes:
        return []
    start = bisect.bisect_left(hashes, _h64(key))
    seen: dict[str, None] = {}
    for i in range(len(hashes)):
        seen.setdefault(owners[(start + i) % len(hashes)], None)
        if len(seen) == len(set(names)):
            break
    return list(seen)


def hash_key(req: SchedRequest, fallback_blocks: int) -> str | None:
    """The chained hash of the session prefix (its last block covers all before it), if any."""
    blocks = tuple(req.prompt.session_blocks) or tuple(req.prompt.blocks[:fallback_blocks])
    return f"{req.model}:{blocks[-1]}" if blocks else None


class DegradedHashScorer:
    type_name: ClassVar[str] = "degraded-hash"

    def __init__(self, name: str, params: DegradedHashParams) -> None:
        self.name = name
        self.params = params

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> DegradedHashScorer:
        return cls(name, DegradedHashParams.model_validate(params))

    def owner(self, req: SchedRequest, states: Sequence[EndpointState]) -> str | None:
        """Name of the pod the ring assigns this request to among `states`, within bounded load."""
        key = hash_key(req, self.params.fallback_blocks)
        if key is None or not states:
            return None
        by_name = {s.endpoint.pod.name: s for s in states}
        limit = load_threshold(list(by_name.values()), self.params.load_factor)  # bounded-load's bound
        walk = ring_walk(key, list(by_name), self.params.replication)
        for name in walk:
            if by_name[name].load <= limit:
                return name
        return walk[0] if walk else None

    def applies(self, req: SchedRequest, state: CycleState) -> bool:
        return not state.read(INDEX_AVAILABLE, True)

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]:
        if state.read(INDEX_AVAILABLE, True):
            return {c.key: 0.0 for c in candidates}
        states = list({c.state.uid: c.state for c in candidates}.values())
        owner = self.owner(req, states)
        return {c.key: 1.0 if c.endpoint.pod.name == owner else 0.0 for c in candidates}

    def score_pods(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> dict[str, float]:
        if state.read(INDEX_AVAILABLE, True):
            return {}
        owner = self.owner(req, endpoints)
        return {e.endpoint.pod.uid: 1.0 for e in endpoints if e.endpoint.pod.name == owner}


SPEC = PluginSpec(
    type_name=DegradedHashScorer.type_name,
    kind="scorer",
    params=DegradedHashParams,
    factory=DegradedHashScorer.create,
    consumes=(INDEX_AVAILABLE.name,),
)

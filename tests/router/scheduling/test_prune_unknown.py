"""Only the slots a picker of fixed order could place are built and scored (pruning.py): the decisions
are exactly those of scoring every pod, over random fleets of mixed pod kinds, prefixes held in slots,
snapshots, conversations and leases another replica holds."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.types import Lookup, PromptTags, SlotRef, SnapshotRef
from llamafleet_router.scheduling.config import default_config, load_config
from llamafleet_router.scheduling.framework import EndpointState, SchedRequest
from llamafleet_router.scheduling.scheduler import Scheduler
from tests.router.scheduling.fakes import BLOCK_CHARS, MODEL, chain, endpoint, prompt, text_hash

PODS, SLOTS = 60, 4
PIPELINE = """
plugins:
  - {type: prefix-lookup}
  - {type: healthy}
  - {type: model}
  - {type: bounded-load}
  - {type: prefix-match, name: prefix}
  - {type: snapshot-match, name: snapshot}
  - {type: session-affinity, name: affinity}
  - {type: free-slots, name: free}
  - {type: queue-depth, name: queue}
  - {type: max-score}
profile:
  plugins:
    - {ref: prefix-lookup}
    - {ref: healthy}
    - {ref: model}
    - {ref: bounded-load}
    - {ref: prefix, weight: 10}
    - {ref: snapshot, weight: 6}
    - {ref: affinity, weight: 3}
    - {ref: free, weight: 1}
    - {ref: queue, weight: 1}
    - {ref: max-score}
leases: {max_attempts: 3}
"""
# Without the model filter the scheduler cannot read the unknown pods from the rows' ranking of one
# model's pods (pruning.py): it ranks the request's own.
ANY_MODEL = PIPELINE.replace("  - {type: model}\n", "").replace("    - {ref: model}\n", "")


KINDS = ({}, {"agent": False}, {"attach": True}, {"cache_prefix": True, "resume_anywhere": False},
         {"restores": False})


def fleet(rng: random.Random) -> list[EndpointState]:
    states = []
    for p in range(PODS):
        kind = KINDS[0] if rng.random() < 0.6 else rng.choice(KINDS)
        ep = endpoint(f"p{p:02d}", n_slots=SLOTS, **kind)  # type: ignore[arg-type]
        if rng.random() < 0.05:  # an idle pod of another model: the model filter drops it
            ep = dataclasses.replace(ep, model="other")
        busy = frozenset(s for s in range(SLOTS) if rng.random() < 0.3)
        released = {s: rng.randrange(1000) for s in range(SLOTS) if rng.random() < 0.5}
        states.append(EndpointState(ep, busy_slots=busy, in_flight=len(busy), queue_depth=rng.randrange(3),
                                    slot_last_used=released, healthy=rng.random() > 0.03))
    return states


async def populate(rng: random.Random, index: InMemoryPrefixIndex, states: list[EndpointState]) -> None:
    for s in rng.sample(states, 8):  # a few pods hold parts of this prompt, or other prompts
        for slot in rng.sample(range(SLOTS), 2):
            tag = rng.choice(("q", "q", "other"))
            n = rng.randrange(2, 12)
            tags = PromptTags("head-q", 4, f"conv-{rng.randrange(3)}") if tag == "q" else None
            await index.record_slot(MODEL, SlotRef(s.uid, slot), chain(tag, n), n * 64, tags)
    for s in rng.sample(states, 2):  # and a snapshot or two of its head
        n = rng.choice((4, 8))
        snap = SnapshotRef(f"fs-{s.uid}", s.uid, n, n * 64, 1000, n_chars=n * BLOCK_CHARS,
                           text_hash=text_hash(n * BLOCK_CHARS))
        await index.record_snapshot(MODEL, snap, chain("q", n))


def scheduler(index: InMemoryPrefixIndex, leases: InMemorySlotLeases, *, prune: bool,
              pipeline: str = PIPELINE) -> Scheduler:
    return Scheduler(load_config(pipeline), index=index, leases=leases, holder_prefix="me",
                     score_every_pod=not prune)


def outcome(d: Any) -> tuple[Any, ...]:
    return (d.endpoint.pod.uid, d.slot, d.action, d.branch, d.predicted_blocks,
            d.snapshot.name if d.snapshot else None)


@pytest.mark.parametrize("pipeline", [PIPELINE, ANY_MODEL], ids=["model-filter", "any-model"])
@pytest.mark.parametrize("seed", range(40))
async def test_pruned_decisions_equal_the_decisions_of_scoring_every_pod(seed: int, pipeline: str) -> None:
    rng = random.Random(seed)
    states = fleet(rng)
    index = InMemoryPrefixIndex()
    await populate(rng, index, states)
    taken = [SlotRef(s.uid, slot) for s in rng.sample(states, 20) for slot in range(SLOTS)]
    conversation = f"conv-{rng.randrange(3)}"
    identity = prompt(MODEL, chain("q", 14), session_prefix_chars=8 * BLOCK_CHARS,
                      shared_chars=4 * BLOCK_CHARS, head_tag="head-q", conversation_tag=conversation)
    decided, scored = [], []
    for prune in (True, False):
        leases = InMemorySlotLeases()
        for ref in taken:  # another replica holds these: placement moves down the ranking
            await leases.acquire(ref, "other", 60)
        sched = scheduler(index, leases, prune=prune, pipeline=pipeline)
        prefix = next(s for s, _ in sched.scorers if s.name == "prefix")
        seen: list[int] = []
        score = prefix.score
        prefix.score = lambda req, state, cands, score=score, seen=seen: (  # type: ignore[method-assign]
            seen.append(len(cands)) or score(req, state, cands))
        req = SchedRequest(f"r{seed}", MODEL, identity, session_id=None)
        decided.append(outcome(await sched.schedule(req, states)))
        scored.append(sum(seen))
    assert decided[0] == decided[1]
    assert scored[0] < scored[1]  # the pruned scheduler scored fewer slots


class _Down(InMemoryPrefixIndex):
    async def lookup(self, *args: Any, **kwargs: Any) -> Lookup:
        raise IndexUnavailable("redis: down")


@pytest.mark.parametrize("seed", range(10))
async def test_the_default_pipeline_prunes_alike_with_the_index_down(seed: int) -> None:
    """Degraded: the consistent hash is a pod-level score, so it is part of what ranks the pruned."""
    rng = random.Random(seed)
    states = fleet(rng)
    req = SchedRequest(f"r{seed}", MODEL, prompt(MODEL, chain(f"d{seed}", 12), session_prefix_chars=2048),
                       session_id=f"s{seed % 3}")
    decided = []
    for prune in (True, False):
        sched = Scheduler(default_config(), index=_Down(), leases=InMemorySlotLeases(), holder_prefix="me",
                          score_every_pod=not prune)
        decided.append(outcome(await sched.schedule(req, states)))
    assert decided[0] == decided[1] and decided[0][3] == "degraded_hash"

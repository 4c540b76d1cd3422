"""The scheduler over the core package's real in-memory index, leases and prompt identity.

This checks the structural contracts (`PrefixIndexLike`, `SlotLeasesLike`) against the
classes the app will pass in, both for mypy (the annotated assignments) and at run time.
"""

from __future__ import annotations

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.prefix.hashing import block_chain
from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Action, SnapshotRef
from llamafleet_router.scheduling.config import default_config
from llamafleet_router.scheduling.framework import PrefixIndexLike, SchedRequest, SlotLeasesLike
from llamafleet_router.scheduling.scheduler import Scheduler

from .fakes import MODEL, slot, state

SYSTEM = "<|im_start|>system\n" + "You are a careful agent. " * 200
TEXT = SYSTEM + "<|im_start|>user\nhello<|im_end|>\n"


def identity(text: str = TEXT) -> PromptIdentity:
    blocks = block_chain(text, seed=MODEL)
    return PromptIdentity(MODEL, text, blocks, 256, len(SYSTEM), "raw")


async def test_routes_to_slot_recorded_in_the_core_in_memory_index() -> None:
    """A slot recorded with the prompt's chain attracts the request, DIRECT, with a real lease."""
    index: PrefixIndexLike = InMemoryPrefixIndex()
    leases: SlotLeasesLike = InMemorySlotLeases()
    prompt = identity()
    assert isinstance(index, InMemoryPrefixIndex)
    await index.record_slot(MODEL, slot("b", 2), prompt.blocks, 4000)
    sched = Scheduler(default_config(), index=index, leases=leases, holder_prefix="r1")
    d = await sched.schedule(SchedRequest("q1", MODEL, prompt), [state("a"), state("b"), state("c")])
    assert (d.endpoint.pod.name, d.slot, d.action, d.predicted_blocks) == (
        "b",
        2,
        Action.DIRECT,
        len(prompt.blocks),
    )
    assert isinstance(leases, InMemorySlotLeases)
    assert await leases.holder(slot("b", 2)) == d.lease_holder
    await sched.release(d)
    assert await leases.holder(slot("b", 2)) is None


async def _prefix_held_by_slot_2_of_b_and_snapshotted() -> tuple[PromptIdentity, SnapshotRef, Scheduler]:
    """A core in-memory index where slot 2 of pod b holds the prompt and pod b has a 3 MB snapshot of
    its session prefix, and a scheduler over it."""
    index = InMemoryPrefixIndex()
    prompt = identity()
    n = len(prompt.session_blocks)
    await index.record_slot(MODEL, slot("b", 2), prompt.blocks, 4000)
    snap = SnapshotRef("pfx", "uid-b", n, n * 64, 3_000_000, last_block=prompt.session_blocks[-1])
    await index.record_snapshot(MODEL, snap, prompt.session_blocks)
    return prompt, snap, Scheduler(default_config(), index=index, leases=InMemorySlotLeases(),
                                   holder_prefix="r1")


async def test_restores_core_index_snapshot_of_the_session_prefix_when_holder_is_busy() -> None:
    """The session prefix's snapshot on pod b is restored into an idle slot of b."""
    prompt, snap, sched = await _prefix_held_by_slot_2_of_b_and_snapshotted()
    n = snap.n_blocks
    d = await sched.schedule(SchedRequest("q1", MODEL, prompt), [state("a"), state("b", busy=(2,))])
    assert (d.endpoint.pod.name, d.action, d.predicted_blocks) == ("b", Action.RESTORE, n)
    assert d.slot != 2 and d.snapshot is not None and d.snapshot.name == "pfx"


async def test_the_scheduler_weighs_each_pods_learned_speeds() -> None:
    """The same session-prefix snapshot, but pod b's restores were seen taking 50 times what the
    configured figures predict: restoring it there (~0.8 s) now loses to computing the ~1,250 tokens
    (~0.6 s at 2,000 tokens/s), so the request computes."""
    prompt, snap, sched = await _prefix_held_by_slot_2_of_b_and_snapshotted()
    assert sched.speeds is not None
    for _ in range(2):
        sched.speeds.observe_restore("uid-b", size_bytes=snap.size_bytes, seconds=60.0)
    # Slot 2 is busy with another replica's request (none of this one's: a prefill here would delay
    # nobody this replica knows of, see action.best_restore).
    d = await sched.schedule(SchedRequest("q1", MODEL, prompt), [state("b", busy=(2,), in_flight=0)])
    assert (d.action, d.snapshot) == (Action.COMPUTE, None)


def _count(registry: object, metric: str, **labels: str) -> float:
    from prometheus_client import CollectorRegistry

    assert isinstance(registry, CollectorRegistry)
    return registry.get_sample_value(metric, labels) or 0.0


async def test_plugin_latency_is_sampled_and_the_lookup_and_lease_are_timed_every_time() -> None:
    """Seventeen histogram observations per decision cost a sixth of it: plugins are sampled (one call
    in PLUGIN_SAMPLE_EVERY, the first one included), the index lookup and the lease wait are not."""
    from prometheus_client import CollectorRegistry

    from llamafleet_router.metrics import PLUGIN_SAMPLE_EVERY, RouterMetrics

    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    index = InMemoryPrefixIndex()
    sched = Scheduler(default_config(), index=index, leases=InMemorySlotLeases(), holder_prefix="r1",
                      metrics_hook=metrics.scheduler_hook)
    n = 2 * PLUGIN_SAMPLE_EVERY + 1
    for i in range(n):
        d = await sched.schedule(SchedRequest(f"q{i}", MODEL, identity()), [state("a"), state("b")])
        await sched.release(d)
    assert _count(registry, "llamafleet_router_index_lookup_seconds_count") == n
    assert _count(registry, "llamafleet_router_lease_wait_seconds_count") == n
    lookup = {"point": "producer", "type": "prefix-lookup", "name": "prefix-lookup"}
    assert _count(registry, "llamafleet_router_plugin_seconds_count", **lookup) == 3
    picker = {"point": "picker", "type": "max-score", "name": "max-score"}
    assert _count(registry, "llamafleet_router_plugin_seconds_count", **picker) == 3

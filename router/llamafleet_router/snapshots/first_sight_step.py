"""First sight: the first request of a long head that no snapshot in the fleet holds builds it once.

The step runs when the request's head (tools and system prompt, before the first user message) is long
enough, is strictly shorter than the prompt, and the slot does not already hold it; then, in order:
- a head already found too long for this pod's slot context is not tried again
  (`head_exceeds_context`: llama-server will answer 400);
- a head the fleet has a snapshot of exactly needs nothing (the scheduler's lookup says so; a head seen
  known in the last seconds is not looked up at all);
- a head that shares a stage with a build in flight waits for that stage first (waits.py);
- the first request of this replica leads the head's single flight and builds it (leader.py); the
  others wait for its snapshot and restore it (waits.py), except while the leader builds detached: they
  restored the same stage and go on at once; and except on a --slot-attach pod where the leader builds:
  they go on once the build saved its first stage, and the server shares the building slot's cells
  (`first_sight_attach`).
Flights are per model, tenant group and exact head: one group never waits for another group's build.
"""

from __future__ import annotations

from dataclasses import replace

from llamafleet_router.scheduling.framework import Branch, Decision
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.detached import DetachedBuilds
from llamafleet_router.snapshots.flights import Prompt
from llamafleet_router.snapshots.heads import HeadMemory
from llamafleet_router.snapshots.leader import Leader
from llamafleet_router.snapshots.preparation import Preparation, head_prompt
from llamafleet_router.snapshots.restore import Restored
from llamafleet_router.snapshots.waits import BuildWaits, HeadBuilds


def worth_first_sight(prompt: Prompt, decision: Decision, restored: Restored | None,
                      config: SnapshotConfig) -> bool:
    """Whether the head is worth a build for this request (pure)."""
    if prompt.head_chars < config.first_sight_min_chars:
        return False
    # An exact resend of a snapshot gains nothing on a hybrid model (the last token is always
    # evaluated again, and recurrent state cannot step back): the prompt must extend the head.
    if prompt.head_chars >= len(prompt.text):
        return False
    # The slot already holds the head (a later turn): nothing to build.
    return restored is not None or decision.predicted_blocks < prompt.head_chars // config.block_chars


class FirstSightStep:
    def __init__(
        self, *, builds: HeadBuilds, waits: BuildWaits, leader: Leader,
        detached: DetachedBuilds, heads: HeadMemory, config: SnapshotConfig, metrics: SnapshotMetrics,
    ) -> None:
        self._builds = builds
        self._waits = waits
        self._leader = leader
        self._detached = detached
        self._heads = heads
        self._config = config
        self._metrics = metrics

    async def run(self, prep: Preparation) -> None:
        prompt = head_prompt(prep.req)
        if prompt is None or not worth_first_sight(prompt, prep.decision, prep.restored, self._config):
            return
        key = prompt.flight_key(prompt.head_chars)  # per tenant group: never another group's build
        heads, model = self._heads, prep.req.model
        if heads.exceeds(key, prep.slot_context):  # tokenized once already: not again for every request
            prep.decision = heads.too_long(model, prep.decision)
            return
        restored = prep.restored
        if restored is not None and (restored.snapshot.text_hash, restored.snapshot.n_chars) == (
                key[2], prompt.head_chars):
            return
        if prep.failed is None and heads.is_known(key):
            return
        lookup = prep.lookup  # the scheduler's: one index lookup per request
        if lookup is None:  # made without the index: no first sight (nothing could find the snapshot)
            return
        exact = [s for s in lookup.snapshots if s.text_hash == key[2] and s.n_chars == prompt.head_chars]
        if exact and (prep.failed is None or any(s != prep.failed for s in exact)):
            heads.remember(key)
            return
        flights = self._builds.flights
        if flights.running(key) is None:
            # Nobody builds this head, but another request may build one that shares a stage with it
            # (another workspace's head, started a moment earlier): wait for that stage and build only
            # the rest, instead of computing the shared part a second time.
            await self._waits.for_stage(prep, prompt)
        leader, flight = flights.join(key)
        build = self._builds.get(key)
        if leader:
            await self._leader.lead(prep, prompt, key, lookup)
        elif prep.target.attach and build is not None and build.pod_uid == prep.target.uid:
            # A --slot-attach pod waits for the slot computing this head itself and shares its cells:
            # a copy from the snapshot would hold the head twice in the pod's pool.
            await self._waits.until_computing(prep, prompt, build, flight)
            prep.decision = replace(prep.decision, branch=Branch.FIRST_SIGHT_ATTACH)
            self._metrics.first_sight.labels("attach").inc()
        elif not self._detached.running(key):  # detached: it restored the same stage, go on now
            got = await self._waits.for_head(prep, flight, prompt, key)
            if not got and heads.exceeds(key, prep.slot_context):  # the leader found it too long
                prep.decision = heads.too_long(model, prep.decision)

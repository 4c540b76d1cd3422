"""Priming: a session prefix built for the first time is loaded into idle slots of its pod at once.

An agent's sessions come in bursts: the 2nd and 3rd sessions of a never-seen prefix arrive while the
first still generates. Each of them would restore the new snapshot on its request path, in the pod's
main loop beside the generating session. Right after the first-sight build saved it, `Primer.start`
restores it, in the background, into up to `count` idle slots of the pod that saved it; the next
sessions then find it in a slot.

Rules, and why:
- Only the pod that saved the snapshot: priming the other pods too (a pull, then a restore) draws
  the burst onto two pods, and on pods that share a machine's cores the 3rd session then waits behind
  two busy main loops (docs/design.md, "A session prefix built on first sight is primed"). Another pod
  gets the snapshot when one of its sessions wants it (ship.py).
- The slots are borrowed from the gateway one at a time (`SlotLender`: claimed like a request's slot,
  so no request is pinned to one while it loads), chosen by the scheduler as a request's would be
  (minus the slots already primed, which now score best), given back as soon as each is loaded (the
  burst's next session may already be waiting for an idle slot: holding two for the whole priming
  queued it on a pod of four slots), and never a pod's last idle slot (`PRIME_MIN_IDLE`).
- A slot the scheduler says already holds the whole prefix is left as it is.
- What a primed slot holds is this replica's knowledge (`PrimedSlots`), kept until a request is pinned
  to the slot (`take`) or for `ttl_s`. On a hybrid model a slot that holds the shared head counts short
  (`lookup_view.resumable`: usually the head plus another session's question), so the scheduler still
  decides to restore the head's snapshot there; the flow skips that restore when the slot was primed with
  exactly that text AND it is untouched: the index still says it holds the prefix (another replica's
  priming would have recorded its own) and llama-server's `GET /slots` shows the slot as the priming
  left it (any task since changes its last task id). That check is one round trip to the pod and one
  to the index, side by side, where the restore it saves is a file read and a copy into the slot in
  the pod's main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.types import Action, SlotRef, SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.scheduling.framework import Decision, SchedRequest
from llamafleet_router.scheduling.lookup_view import snapshot_tags
from llamafleet_router.snapshots.base import SnapshotMetrics
from llamafleet_router.snapshots.detached import SlotLender
from llamafleet_router.snapshots.restore import Restored, RestoreExecutor

log = logging.getLogger(__name__)

PRIME_MIN_IDLE = 2  # a pod is primed only while it has this many idle slots: one stays free for requests
_PRIME_START_S = 5.0  # priming waits at most this long for the request that built the prefix to answer


def same_text(a: SnapshotRef, b: SnapshotRef) -> bool:
    """Whether two snapshots hold the same prompt text (copies of one snapshot on different pods do)."""
    return (a.text_hash, a.n_chars) == (b.text_hash, b.n_chars)


#: How llama-server's GET /slots shows a slot: (tokens in its cache, its last task id). Both are absent
#: until the slot's first task (a restore is not one): then any task, and a restore, change them.
SlotState = tuple[int | None, int | None]


def slot_state(slots: list[dict[str, Any]], slot: int) -> SlotState | None:
    """`slot`'s entry of a GET /slots answer; None when absent or not understood."""
    for entry in slots:
        if isinstance(entry, dict) and entry.get("id") == slot:
            n, task = entry.get("n_prompt_tokens"), entry.get("id_task")
            if (n is None or isinstance(n, int)) and (task is None or isinstance(task, int)):
                return n, task
    return None


@dataclass(frozen=True, slots=True)
class Primed:
    snapshot: SnapshotRef  # the copy on the slot's pod
    state: SlotState  # as GET /slots showed the slot right after the restore
    deadline: float


@dataclass
class PrimedSlots:
    """Slots this replica loaded with a snapshot ahead of demand and that no request used since."""

    ttl_s: float = 60.0
    _slots: dict[SlotRef, Primed] = field(default_factory=dict)

    def mark(self, slot: SlotRef, snap: SnapshotRef, state: SlotState) -> None:
        self._slots[slot] = Primed(snap, state, time.monotonic() + self.ttl_s)

    def holds(self, slot: SlotRef, snap: SnapshotRef) -> bool:
        entry = self._slots.get(slot)
        return entry is not None and entry.deadline > time.monotonic() and same_text(entry.snapshot, snap)

    def take(self, slot: SlotRef) -> Primed | None:
        """What `slot` was primed with (None: nothing, or too long ago); it holds that no longer once a
        request is pinned to it, so the entry goes."""
        entry = self._slots.pop(slot, None)
        if entry is None or entry.deadline <= time.monotonic():
            return None
        return entry

    def slots(self) -> list[SlotRef]:
        return list(self._slots)


class Primer:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, restorer: RestoreExecutor,
        metrics: SnapshotMetrics, tasks: TaskSet, slots: PrimedSlots, api_key: str | None = None,
    ) -> None:
        self._http = http
        self._api_key = api_key  # llama-server's own key, for its /slots
        self._index = index
        self._restorer = restorer
        self._metrics = metrics
        self._tasks = tasks
        self.slots = slots

    async def reuse(
        self, model: str, blocks: Sequence[str], url: str, slot: SlotRef, wanted: SnapshotRef,
        primed: Primed | None,
    ) -> Restored | None:
        """The restore of `wanted` into `slot` when the priming already did it and the slot is untouched
        (restoring it again would change nothing); None: restore it."""
        if primed is None or not same_text(primed.snapshot, wanted):
            return None
        if not await self.still_holds(model, blocks, url, slot, primed):
            return None
        self._metrics.primes.labels("used").inc()
        return Restored(primed.snapshot, primed.snapshot.n_tokens, False, 0.0)

    async def still_holds(self, model: str, blocks: Sequence[str], url: str, slot: SlotRef,
                          primed: Primed) -> bool:
        """Whether `slot` (of the pod at `url`) still holds what it was primed with: the index says so
        (another replica's priming would have recorded its own prefix there) and llama-server shows the
        slot as the priming left it (any task since changes its last task id). False when either cannot
        tell: the restore is the safe way."""
        snap = primed.snapshot
        try:
            lookup, slots = await asyncio.gather(self._index.lookup(model, blocks[: snap.n_blocks]),
                                                 LlamaClient(url, self._http, self._api_key).slots())
        except Exception as exc:
            log.info("checking a primed slot failed", extra={"pod": url, "error": str(exc)})
            return False
        return lookup.slots.get(slot, 0) >= snap.n_blocks and slot_state(slots, slot.slot) == primed.state

    def start(
        self, req: SchedRequest, snap: SnapshotRef, pods: Sequence[PodStatus], agents: dict[str, str],
        lender: SlotLender, count: int, after: asyncio.Event | None = None,
    ) -> None:
        """Load `snap` (a prefix of `req`'s prompt) into up to `count` idle slots of the pod that saved it,
        once `after` is set (the request that built it answers) or `_PRIME_START_S` passed: each load is
        a copy in the pod's main loop, which would otherwise delay that request's first token."""
        here = next((p for p in pods if p.endpoint.uid == snap.pod_uid), None)
        primable = here is not None and here.ready and here.endpoint.agent_url and here.endpoint.restores
        if count > 0 and here is not None and primable:
            self._tasks.spawn(self._prime(req, snap, here.endpoint.uid, agents, lender, count, after),
                              name="prime-slots")

    async def _prime(
        self, req: SchedRequest, snap: SnapshotRef, uid: str, agents: dict[str, str], lender: SlotLender,
        count: int, after: asyncio.Event | None = None,
    ) -> None:
        if after is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PRIME_START_S):
                    await after.wait()
        done: frozenset[int] = frozenset()
        for _ in range(count):
            borrowed = await lender.lend(req, pod_uid=uid, min_idle=PRIME_MIN_IDLE, avoid=done)
            if borrowed is None:
                self._metrics.primes.labels("no_slot").inc()
                return
            decision = borrowed.decision
            try:
                loaded = await self._load(req, snap, decision, agents)
            except Exception:
                log.exception("priming a slot failed")
                self._metrics.primes.labels("failed").inc()
                return
            finally:
                borrowed.release()
            if not loaded:  # the agent refused it: another slot would fare no better
                return
            done |= {decision.slot}

    async def _load(
        self, req: SchedRequest, snap: SnapshotRef, decision: Decision, agents: dict[str, str]
    ) -> bool:
        """Restore `snap` into the borrowed slot and mark it primed; False when that failed."""
        ref = decision.slot_ref
        if (decision.action is Action.DIRECT and decision.predicted_blocks >= snap.n_blocks) or \
                self.slots.holds(ref, snap):
            self._metrics.primes.labels("held").inc()
            return True
        outcome = await self._restorer.restore(req.model, req.prompt.blocks, decision.endpoint, decision.slot,
                                               snap, agents)
        if not isinstance(outcome, Restored):
            self._metrics.primes.labels("failed").inc()
            return False
        llama = LlamaClient(decision.endpoint.url, self._http, self._api_key)
        state = slot_state(await llama.slots(), decision.slot)
        if state is None or state[0] not in (None, outcome.n_tokens):
            self._metrics.primes.labels("failed").inc()
            return False
        # Before the lease is given back: a request scheduled next must see what the slot holds.
        self.slots.mark(ref, outcome.snapshot, state)
        try:
            blocks = req.prompt.blocks[: snap.n_blocks]
            # A checkpointing pod's primed slot stays untagged: a session there then still takes the
            # restore path, which skips the restore only once `/slots` shows the slot untouched (`slots`),
            # a check that a slot hit would not make.
            tags = snapshot_tags(req.prompt, snap) if decision.endpoint.resume_anywhere else None
            await self._index.record_slot(req.model, ref, blocks, outcome.n_tokens, tags)
        except Exception as exc:  # the primed mark still lets this replica use it
            log.info("recording a primed slot failed", extra={"error": str(exc)})
        self._metrics.primes.labels("loaded").inc()
        log.info("slot primed", extra={"snapshot": snap.name, "pod": decision.endpoint.url,
                                       "slot": decision.slot, "seconds": round(outcome.seconds, 4)})
        return True

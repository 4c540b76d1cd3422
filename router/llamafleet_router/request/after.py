"""After a response: record what the slot now holds and check the prediction; the lease's release
(`release`, run by the request's slot claim once the record is written).

Runs in a tracked background task, never on the request path. The index is a hint and llama-server's
`timings.cache_n` is the truth: when the index predicted that the slot held part of the prompt
(`predicted_blocks > 0`) but the server reused about nothing, the entry was wrong and is dropped
(`forget_slot`) before the new content is recorded. A --cache-prefix server also says whether it keeps
the prompt's head as a RAM prefix entry (`timings.prefix_entry_n`): recorded under the head's RAM slot
(`types.ram_slot`), which any slot of the pod can load, or dropped when a request sent there for it
found none (evicted). When the response bears the prediction out and the request's provisional record
(`dispatched`) has landed, that record already says what the slot holds (the same blocks and tags;
the index never reads a slot's token count), and writing it again would be a fifth Redis round trip
per request, the heaviest script, for nothing. Index errors are logged and counted, never raised;
`IndexUnavailable` also flips the app into degraded mode until the index answers again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

from llamafleet_core.index.base import IndexUnavailable, PrefixIndex
from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import PromptTags, SlotRef, ram_slot
from llamafleet_router.background import IndexHealth
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.proxy.sse import Stats
from llamafleet_router.scheduling.data import Branch
from llamafleet_router.scheduling.framework import ANY_SLOT, Decision, EndpointState, SchedRequest
from llamafleet_router.scheduling.speeds import SpeedBook

log = logging.getLogger(__name__)


class SchedulerLike(Protocol):
    """What the app needs of `scheduling.scheduler.Scheduler`. Its `schedule` already runs the plugins'
    `on_decision` hooks (session affinity) synchronously, so the app does not call them again."""

    @property
    def speeds(self) -> SpeedBook | None: ...  # learned per pod; None: the configured figures stay

    async def schedule(self, req: SchedRequest, endpoints: Sequence[EndpointState]) -> Decision: ...

    async def release(self, decision: Decision) -> None: ...


def judge(predicted_blocks: int, cache_n: int, block_tokens: float) -> str:
    """Compare the index's prediction with the server's reuse.

    "About nothing" is under half a block: templates open with a few shared tokens (`<|im_start|>system`),
    so a literal 0 would call every unrelated prompt a partial hit."""
    predicted_hit = predicted_blocks > 0
    actual_hit = cache_n >= max(1.0, block_tokens / 2)
    if predicted_hit:
        return "hit" if actual_hit else "false_hit"
    return "surprise_hit" if actual_hit else "miss"


class AfterResponse:
    def __init__(
        self,
        *,
        index: PrefixIndex,
        scheduler: SchedulerLike,
        metrics: RouterMetrics,
        health: IndexHealth,
        block_chars: int,
        chars_per_token: float,
        speeds: SpeedBook | None = None,
    ) -> None:
        self._index = index
        self._speeds = speeds
        self._scheduler = scheduler
        self._metrics = metrics
        self._health = health
        self._block_chars = block_chars
        self._chars_per_token = chars_per_token
        # Per slot, the request this router dispatched there last. The next request may take a slot
        # before the previous one's `finished` runs (the slot is given up synchronously), and its record
        # must not be overwritten by that late one: the index would name the previous prompt's head and
        # conversation for a slot holding another, and the next turn would be sent there.
        self._latest: dict[SlotRef, str] = {}
        # Per slot, the request whose provisional record has landed in the index (and still stands).
        self._landed: dict[SlotRef, str] = {}

    @property
    def index(self) -> PrefixIndex:
        """The prefix index this hook writes to (the snapshot flow records snapshots in the same one)."""
        return self._index

    async def release(self, decision: Decision) -> None:
        try:
            await self._scheduler.release(decision)
        except IndexUnavailable as exc:
            self._index_failed("release", exc)
        except Exception:
            log.exception("lease release failed", extra={"pod": decision.endpoint.url, "slot": decision.slot})

    async def dispatched(self, req: SchedRequest, decision: Decision) -> None:
        """Record at once, provisionally, that the chosen slot will hold this prompt.

        Written when the request is forwarded (in a background task, while the pod prefills), so a
        session's next turn, or another replica, finds the slot even if it arrives before this response
        has ended. `finished` then checks it against the server's `cache_n` and records the real size."""
        if decision.slot == ANY_SLOT:
            return
        ref = SlotRef(decision.endpoint.pod.uid, decision.slot)
        self._latest[ref] = req.request_id  # before any await: `finished` of the slot's previous request
        self._landed.pop(ref, None)
        estimate = int(len(req.prompt.blocks) * self._block_chars / self._chars_per_token)
        try:
            await self._index.record_slot(req.model, ref, req.prompt.blocks, estimate, req.prompt.tags)
            if self._latest.get(ref) == req.request_id:
                self._landed[ref] = req.request_id
        except IndexUnavailable as exc:
            self._index_failed("record_dispatched", exc)
        except Exception:
            self._metrics.index_errors.labels("record_dispatched").inc()
            log.exception("recording the slot in the index failed")

    async def withdrawn(self, req: SchedRequest, decision: Decision, recorded: Awaitable[None]) -> None:
        """The pod could not be reached, so the slot never got this prompt: drop its provisional record
        once `recorded` (the `dispatched` write) is done. A pod that just died is purged from the index
        when it is marked down, and a write still on its way then would outlive that purge until the
        pod came back, naming a dead pod's slot."""
        await recorded
        if decision.slot == ANY_SLOT:
            return
        ref = SlotRef(decision.endpoint.pod.uid, decision.slot)
        if self._latest.get(ref) != req.request_id:
            return  # a later request of this router was dispatched there, and its record stands
        self._latest.pop(ref, None)
        self._landed.pop(ref, None)
        try:
            await self._index.forget_slot(req.model, ref)
        except IndexUnavailable as exc:
            self._index_failed("forget_dispatched", exc)
        except Exception:
            self._metrics.index_errors.labels("forget_dispatched").inc()
            log.exception("dropping the slot's provisional record failed")

    async def finished(self, req: SchedRequest, decision: Decision, outcome: Outcome) -> None:
        """Record what the slot holds now and learn the pod's speed; run before the slot's lease goes
        (`SlotClaim.release(first=...)`): the client may already be sending its next turn, and another
        replica, which can take the slot only once the lease is gone, must record after this."""
        if outcome.status < 400 and outcome.stats is not None and outcome.stats.cache_n is not None:
            slot = decision.slot if decision.slot != ANY_SLOT else outcome.served_slot
            await self._verify_and_record(req, decision, slot, outcome.stats)
            self._learn(req.prompt, decision, outcome.stats)

    def _learn(self, prompt: PromptIdentity, decision: Decision, stats: Stats) -> None:
        """Teach the cost model how fast this pod computed the prompt (scheduling/speeds.py)."""
        if self._speeds is None or stats.prompt_ms is None or not stats.prompt_n:
            return
        endpoint = decision.endpoint
        if self._speeds.observe_prompt(endpoint, prompt, cached=stats.cache_n or 0, computed=stats.prompt_n,
                                       seconds=stats.prompt_ms / 1000):
            self._metrics.show_speeds(endpoint.url, self._speeds.learned(endpoint.pod.uid))

    async def _verify_and_record(
        self, req: SchedRequest, decision: Decision, slot: int | None, stats: Stats
    ) -> None:
        model, prompt = req.model, req.prompt
        cache_n = stats.cache_n or 0
        block_tokens = self._block_chars / self._chars_per_token
        predicted_tokens = decision.predicted_blocks * block_tokens
        self._metrics.predicted_cached_tokens.labels(model).inc(predicted_tokens)
        self._metrics.actual_cached_tokens.labels(model).inc(cache_n)
        for source, shared in (("attached", stats.attached_n), ("ram_prefix", stats.prefix_n)):
            if shared:  # a patched server's own split of cache_n: what the pod, not the slot, held
                self._metrics.shared_cached_tokens.labels(model, source).inc(shared)
        self._metrics.prompt_tokens.labels(model).inc(stats.prompt_n or 0)
        verdict = judge(decision.predicted_blocks, cache_n, block_tokens)
        self._metrics.predictions.labels(verdict).inc()
        if slot is None or slot < 0:
            return
        ref = SlotRef(decision.endpoint.pod.uid, slot)
        if self._latest.get(ref, req.request_id) != req.request_id:
            return  # a later request of this router holds the slot now, and recorded it
        self._latest.pop(ref, None)
        landed = self._landed.pop(ref, None) == req.request_id
        try:
            if verdict == "false_hit":
                log.info("index predicted a hit the server did not see; entry dropped",
                         extra={"pod": decision.endpoint.url, "slot": slot,
                                "predicted_blocks": decision.predicted_blocks, "cache_n": cache_n})
                await self._index.forget_slot(model, ref)
            if verdict == "false_hit" or not landed:
                await self._index.record_slot(model, ref, prompt.blocks, stats.n_tokens, prompt.tags)
            if decision.endpoint.cache_prefix:
                await self._record_ram_entry(req, decision, stats)
        except IndexUnavailable as exc:
            self._index_failed("record_slot", exc)
        except Exception:
            self._metrics.index_errors.labels("record_slot").inc()
            log.exception("recording the slot in the index failed")

    async def _record_ram_entry(self, req: SchedRequest, decision: Decision, stats: Stats) -> None:
        """What the pod's RAM prefix entries hold of this prompt's head, as the server reported it."""
        tags = req.prompt.tags
        if not tags.head or tags.head_blocks <= 0 or stats.prefix_entry_n is None:
            return
        ref = SlotRef(decision.endpoint.pod.uid, ram_slot(tags.head))
        if stats.prefix_entry_n > 0:
            await self._index.record_slot(req.model, ref, req.prompt.blocks[:tags.head_blocks],
                                          stats.prefix_entry_n, PromptTags(tags.head, tags.head_blocks))
        elif decision.branch == Branch.RAM_HIT:  # sent for the entry, which the server no longer keeps
            await self._index.forget_slot(req.model, ref)

    def _index_failed(self, op: str, exc: Exception) -> None:
        self._metrics.index_errors.labels(op).inc()
        self._health.mark_degraded(f"{op}: {exc}")

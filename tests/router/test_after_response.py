"""After a response: what the index ends up saying about the slot, whatever order the hooks ran in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.types import Action, PromptTags, SlotRef
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.fleet.state import InFlight
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.proxy.sse import Stats
from llamafleet_router.request.after import AfterResponse
from llamafleet_router.request.claim import Claims
from llamafleet_router.scheduling.data import Branch
from llamafleet_router.scheduling.framework import ANY_SLOT, Decision, SchedRequest
from tests.router.scheduling.fakes import MODEL, chain, endpoint, prompt, slot


@dataclass
class _NoLeases:
    speeds = None

    released: int = 0

    async def schedule(self, req: object, endpoints: object) -> Decision:
        raise AssertionError("not scheduling here")

    async def release(self, decision: Decision) -> None:
        self.released += 1


def _tags(tag: str) -> PromptTags:
    return PromptTags(head=f"head-{tag}", head_blocks=4, conversation=f"conv-{tag}")


def _request(rid: str, tag: str) -> SchedRequest:
    identity = prompt(MODEL, chain(tag, 6), shared_chars=4 * 256, head_tag=f"head-{tag}",
                      conversation_tag=f"conv-{tag}")
    return SchedRequest(rid, MODEL, identity, None)


async def test_a_late_finish_does_not_overwrite_the_record_of_the_request_that_took_the_slot_since() -> None:
    """Request 1 ends and gives its slot up at once; request 2 takes it and is recorded; request 1's
    `finished` runs only then. The index must keep naming request 2's head and conversation: a slot
    tagged with request 1's conversation would draw that conversation's next turn to a slot that no
    longer holds it."""
    index = InMemoryPrefixIndex()
    metrics = RouterMetrics(CollectorRegistry())
    leases = _NoLeases()
    after = AfterResponse(index=index, scheduler=leases, metrics=metrics,
                          health=IndexHealth(index, metrics, 1.0), block_chars=256, chars_per_token=4.0)
    one, two = _request("r1", "a"), _request("r2", "b")
    decision = Decision(endpoint("p"), 0, Action.DIRECT, None, 0, "cold", lease_holder="replica")
    tasks = TaskSet()  # the lease goes after the record, both in the background (request/claim.py)
    claims = Claims(in_flight=InFlight(metrics), tasks=tasks, release_lease=after.release)
    claim_one, claim_two = claims.claim(decision), claims.claim(decision)
    await after.dispatched(one, decision)
    await after.dispatched(two, decision)
    done = Outcome(status=200, stats=Stats(cache_n=0, prompt_n=1500, predicted_n=8), completed=True)
    claim_one.release(first=after.finished(one, decision, done))
    await tasks.drain()
    found = await index.lookup(MODEL, chain("b", 6), _tags("b"))
    assert found.slots == {slot("p", 0): 6} and found.conversation == slot("p", 0)
    assert (await index.lookup(MODEL, chain("a", 6), _tags("a"))).slots == {}
    assert leases.released == 1
    # Its own finish, in order, records it again.
    claim_two.release(first=after.finished(two, decision, done))
    await tasks.drain()
    found = await index.lookup(MODEL, chain("b", 6), _tags("b"))
    assert found.conversation == slot("p", 0) and leases.released == 2


class CountingIndex(InMemoryPrefixIndex):
    """The in-memory index, counting its slot writes; `down` makes the next ones fail as Redis would."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[SlotRef, int, int]] = []  # (slot, blocks, n_tokens): records, forgets
        self.down = False

    async def record_slot(self, model: str, slot: SlotRef, blocks: Sequence[str], n_tokens: int,
                          tags: PromptTags | None = None) -> None:
        if self.down:
            raise IndexUnavailable("redis did not answer in time")
        self.writes.append((slot, len(blocks), n_tokens))
        await super().record_slot(model, slot, blocks, n_tokens, tags)

    async def forget_slot(self, model: str, slot: SlotRef) -> None:
        self.writes.append((slot, 0, 0))
        await super().forget_slot(model, slot)


def _after(index: CountingIndex) -> AfterResponse:
    metrics = RouterMetrics(CollectorRegistry())
    return AfterResponse(index=index, scheduler=_NoLeases(), metrics=metrics,
                         health=IndexHealth(index, metrics, 1.0), block_chars=256, chars_per_token=4.0)


_SERVED = Outcome(status=200, stats=Stats(cache_n=0, prompt_n=1500, predicted_n=8),
                  completed=True)


async def test_a_landed_provisional_record_is_not_written_again_when_the_response_bears_it_out() -> None:
    index = CountingIndex()
    after = _after(index)
    req = _request("r1", "a")
    decision = Decision(endpoint("p"), 0, Action.DIRECT, None, 0, Branch.COLD)
    await after.dispatched(req, decision)
    await after.finished(req, decision, _SERVED)
    assert index.writes == [(slot("p", 0), 6, 384)]  # the provisional record only
    found = await index.lookup(MODEL, chain("a", 6), _tags("a"))
    assert found.slots == {slot("p", 0): 6} and found.conversation == slot("p", 0)
    # The slot's next request records again provisionally, and its finish again adds nothing.
    again = _request("r2", "a")
    await after.dispatched(again, decision)
    await after.finished(again, decision, _SERVED)
    assert len(index.writes) == 2


async def test_the_finish_records_when_the_provisional_record_did_not_land() -> None:
    index = CountingIndex()
    after = _after(index)
    req = _request("r1", "a")
    decision = Decision(endpoint("p"), 0, Action.DIRECT, None, 0, Branch.COLD)
    index.down = True
    await after.dispatched(req, decision)
    index.down = False
    await after.finished(req, decision, _SERVED)
    assert index.writes == [(slot("p", 0), 6, 1508)]
    assert (await index.lookup(MODEL, chain("a", 6), _tags("a"))).slots == {slot("p", 0): 6}


async def test_the_finish_records_a_slot_the_decision_did_not_name_or_a_hit_the_server_denied() -> None:
    index = CountingIndex()
    after = _after(index)
    # Any slot: nothing was recorded provisionally, and the server says which slot served it.
    anywhere = Decision(endpoint("p"), ANY_SLOT, Action.DIRECT, None, 0, Branch.COLD)
    req = _request("r1", "a")
    await after.dispatched(req, anywhere)
    assert index.writes == []
    served = Outcome(status=200, stats=Stats(cache_n=0, prompt_n=1500, predicted_n=8),
                     completed=True, served_slot=2)
    await after.finished(req, anywhere, served)
    assert index.writes == [(slot("p", 2), 6, 1508)]
    # A hit the server did not see: the entry is dropped and written again whatever landed before.
    index.writes.clear()
    hit = Decision(endpoint("p"), 0, Action.DIRECT, None, 4, Branch.SLOT_HIT)
    req = _request("r2", "b")
    await after.dispatched(req, hit)
    await after.finished(req, hit, _SERVED)
    assert index.writes == [(slot("p", 0), 6, 384), (slot("p", 0), 0, 0), (slot("p", 0), 6, 1508)]


@pytest.mark.parametrize("landed_first", [True, False])
async def test_a_withdrawn_request_leaves_nothing_for_a_later_finish_to_trust(landed_first: bool) -> None:
    index = CountingIndex()
    after = _after(index)
    decision = Decision(endpoint("p"), 0, Action.DIRECT, None, 0, Branch.COLD)
    gone = _request("r1", "a")
    recorded = after.dispatched(gone, decision)
    if landed_first:
        await recorded
        await after.withdrawn(gone, decision, _done())
    else:
        await after.withdrawn(gone, decision, recorded)
    assert (await index.lookup(MODEL, chain("a", 6), _tags("a"))).slots == {}
    # A finish of the withdrawn request (never sent) must not count the dropped record as standing.
    await after.finished(gone, decision, _SERVED)
    assert (await index.lookup(MODEL, chain("a", 6), _tags("a"))).slots == {slot("p", 0): 6}


async def _done() -> None:
    return None

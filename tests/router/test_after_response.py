"""After a response: what the index ends up saying about the slot, whatever order the hooks ran in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.types import Action, PromptTags
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.fleet.state import InFlight
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.proxy.sse import Stats
from llamafleet_router.request.after import AfterResponse
from llamafleet_router.request.claim import Claims
from llamafleet_router.scheduling.framework import Decision, SchedRequest
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

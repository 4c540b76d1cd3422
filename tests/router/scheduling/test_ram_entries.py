"""RAM prefix entries (--cache-prefix): the heads a patched pod keeps in RAM count for any of its slots.

The index records them under a negative slot per head (`types.ram_slot`) once the server reported one
(`timings.prefix_entry_n`); the scheduler scores and decides with them (`ram_hit`), and no request is
ever pinned to such a slot. The after-response half runs on the real in-memory index.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.types import Action, Lookup, PromptTags, SlotRef, ram_slot
from llamafleet_router.background import IndexHealth
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome
from llamafleet_router.proxy.sse import Stats
from llamafleet_router.request.after import AfterResponse
from llamafleet_router.scheduling.action import choose_action
from llamafleet_router.scheduling.candidates import candidates, slot_groups
from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.scheduling.data import Branch
from llamafleet_router.scheduling.framework import Candidate, Decision, SchedRequest
from llamafleet_router.scheduling.lookup_view import pod_best_slots, ram_blocks
from llamafleet_router.scheduling.plugins.scorers.prefix_match import PrefixMatchScorer

from .fakes import BLOCK_CHARS, MODEL, chain, endpoint, prompt, slot, state
from .test_scorers import with_lookup

HEAD = "head-agent"
HEAD_BLOCKS = 8
PROMPT = prompt(MODEL, chain("p", 12), shared_chars=HEAD_BLOCKS * BLOCK_CHARS + 100, head_tag=HEAD)


def _ram(name: str) -> SlotRef:
    return SlotRef(f"uid-{name}", ram_slot(HEAD))


def _kept_in_ram(name: str, *, slots: dict[SlotRef, int] | None = None) -> Lookup:
    ref = _ram(name)
    return Lookup(slots={**(slots or {}), ref: HEAD_BLOCKS}, exact_head=frozenset({ref}))


def test_ram_slots_are_negative_distinct_per_head_and_stable() -> None:
    assert ram_slot(HEAD) == ram_slot(HEAD) < 0
    assert ram_slot(HEAD) != ram_slot("head-other")
    assert SlotRef.parse(SlotRef("uid-a", ram_slot(HEAD)).key()) == SlotRef("uid-a", ram_slot(HEAD))


def test_a_slot_of_a_cache_prefix_pod_gets_the_head_the_pod_keeps_in_ram() -> None:
    lookup = _kept_in_ram("a")
    choice = choose_action(PROMPT, endpoint("a", cache_prefix=True), 1, lookup, ActionCosts())
    assert (choice.action, choice.branch, choice.predicted_blocks) == (Action.DIRECT, Branch.RAM_HIT, 8)
    # a pod that does not run --cache-prefix loads no entry: the same record gives it nothing
    plain = choose_action(PROMPT, endpoint("a"), 1, lookup, ActionCosts(restore_enabled=False))
    assert (plain.branch, plain.predicted_blocks) == (Branch.COLD, 0)


def test_a_slot_holding_more_than_the_ram_entry_is_a_slot_hit() -> None:
    lookup = _kept_in_ram("a", slots={slot("a", 2): 11})
    choice = choose_action(PROMPT, endpoint("a", cache_prefix=True), 2, lookup, ActionCosts())
    assert (choice.branch, choice.predicted_blocks) == (Branch.SLOT_HIT, 11)
    assert ram_blocks(lookup, endpoint("a", cache_prefix=True)) == HEAD_BLOCKS


def test_prefix_match_scores_every_idle_slot_of_the_pod_keeping_the_head_above_an_empty_pod() -> None:
    a, b = state("a", cache_prefix=True, n_slots=2), state("b", cache_prefix=True, n_slots=2)
    lookup = _kept_in_ram("a", slots={slot("a", 1): 2})
    req = SchedRequest("r", MODEL, PROMPT, None)
    scores = PrefixMatchScorer("pm").score(req, with_lookup(lookup), [
        Candidate(s, n) for s in (a, b) for n in s.idle_slots])
    # the whole head, with its last partial block (the entry ends where the head does)
    assert scores[slot("a", 0)] == scores[slot("a", 1)] == PROMPT.shared_chars / (12 * BLOCK_CHARS)
    assert scores[slot("b", 0)] == scores[slot("b", 1)] == 0.0


def test_no_request_is_pinned_to_a_ram_slot() -> None:
    lookup = _kept_in_ram("a")
    s = state("a", cache_prefix=True, n_slots=2)
    assert pod_best_slots(lookup, "uid-a", 2) is None
    picked = candidates([s], slot_groups(lookup, ()), idle_only=True)
    assert {c.slot for c in picked} <= {0, 1} and picked


def _after(index: InMemoryPrefixIndex) -> AfterResponse:
    metrics = RouterMetrics(CollectorRegistry())

    class _Scheduler:
        speeds = None

        async def schedule(self, req: object, endpoints: object) -> Decision:
            raise AssertionError("not scheduling here")

        async def release(self, decision: Decision) -> None:
            return None

    return AfterResponse(index=index, scheduler=_Scheduler(), metrics=metrics,
                         health=IndexHealth(index, metrics, 1.0), block_chars=BLOCK_CHARS,
                         chars_per_token=4.0)


async def test_the_head_a_server_keeps_in_ram_is_recorded_for_its_pod_and_dropped_once_gone() -> None:
    index = InMemoryPrefixIndex()
    after = _after(index)
    req = SchedRequest("r1", MODEL, PROMPT, None)
    pod = endpoint("a", cache_prefix=True)
    first = Decision(pod, 0, Action.COMPUTE, None, 0, Branch.COLD)
    saved = Stats(cache_n=0, prompt_n=3000, predicted_n=4, prefix_entry_n=2100)
    await after.finished(req, first, Outcome(status=200, stats=saved, completed=True))
    tags = PromptTags(head=HEAD, head_blocks=HEAD_BLOCKS)
    found = await index.lookup(MODEL, chain("p", 12), tags)
    assert found.slots == {slot("a", 0): 12, _ram("a"): HEAD_BLOCKS}
    assert _ram("a") in found.exact_head

    # sent to another slot for the entry, which the server evicted since: the record goes
    second = Decision(pod, 1, Action.DIRECT, None, HEAD_BLOCKS, Branch.RAM_HIT)
    gone = Stats(cache_n=0, prompt_n=3000, predicted_n=4, prefix_n=0, prefix_entry_n=0)
    await after.finished(SchedRequest("r2", MODEL, PROMPT, None), second,
                         Outcome(status=200, stats=gone, completed=True))
    assert _ram("a") not in (await index.lookup(MODEL, chain("p", 12), tags)).slots


async def test_upstream_answers_and_pods_without_cache_prefix_record_no_ram_entry() -> None:
    index = InMemoryPrefixIndex()
    after = _after(index)
    req = SchedRequest("r1", MODEL, PROMPT, None)
    upstream = Stats(cache_n=0, prompt_n=3000, predicted_n=4)  # no prefix_entry_n
    await after.finished(req, Decision(endpoint("a", cache_prefix=True), 0, Action.COMPUTE, None, 0,
                                       Branch.COLD), Outcome(status=200, stats=upstream, completed=True))
    reported = Stats(cache_n=0, prompt_n=3000, predicted_n=4, prefix_entry_n=2100)
    await after.finished(req, Decision(endpoint("b"), 0, Action.COMPUTE, None, 0, Branch.COLD),
                         Outcome(status=200, stats=reported, completed=True))
    found = await index.lookup(MODEL, chain("p", 12), PromptTags(head=HEAD, head_blocks=HEAD_BLOCKS))
    assert set(found.slots) == {slot("a", 0), slot("b", 0)}

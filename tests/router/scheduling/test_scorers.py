"""Scorers: pure functions of (request, cycle state, slot candidates), checked one by one."""

from __future__ import annotations

from llamafleet_core.types import Action, Lookup
from llamafleet_router.scheduling.framework import (
    INDEX_AVAILABLE,
    LOOKUP,
    RESTORE_ENABLED,
    Candidate,
    CycleState,
    Decision,
    EndpointState,
    SchedRequest,
)
from llamafleet_router.scheduling.plugins.scorers.degraded_hash import (
    DegradedHashParams,
    DegradedHashScorer,
    ring_walk,
)
from llamafleet_router.scheduling.plugins.scorers.free_slots import FreeSlotsScorer
from llamafleet_router.scheduling.plugins.scorers.prefix_match import PrefixMatchScorer
from llamafleet_router.scheduling.plugins.scorers.queue_depth import QueueDepthScorer
from llamafleet_router.scheduling.plugins.scorers.session_affinity import (
    SessionAffinityParams,
    SessionAffinityScorer,
)
from llamafleet_router.scheduling.plugins.scorers.snapshot_match import (
    SnapshotMatchParams,
    SnapshotMatchScorer,
)

from .fakes import MODEL, chain, request, slot, snapshot, state
from .fakes import prompt as make_prompt


def candidates(*states: EndpointState) -> list[Candidate]:
    return [Candidate(s, n) for s in states for n in s.idle_slots]


def with_lookup(lookup: Lookup, *, available: bool = True) -> CycleState:
    cs = CycleState()
    cs.write(LOOKUP, lookup)
    cs.write(INDEX_AVAILABLE, available)
    return cs


def test_prefix_match_scores_matched_blocks_over_total_per_slot() -> None:
    """Slot-level: only the slot holding the run gets its share; other slots of the pod get 0."""
    a, b = state("a"), state("b")
    cs = with_lookup(Lookup(slots={slot("b", 2): 8, slot("a", 0): 3}))
    scores = PrefixMatchScorer("pm").score(request(n_blocks=10), cs, candidates(a, b))
    assert scores[slot("b", 2)] == 0.8
    assert scores[slot("a", 0)] == 0.3
    assert scores[slot("b", 1)] == 0.0


def test_prefix_match_uses_pod_level_match_when_build_attaches() -> None:
    """With --slot-attach every slot of the pod can use what one slot holds; the slot holding it scores
    a little above the others (attaching elsewhere would replace that slot's own content)."""
    a = state("a", attach=True)
    cs = with_lookup(Lookup(slots={slot("a", 0): 5}))
    scores = PrefixMatchScorer("pm").score(request(n_blocks=10), cs, candidates(a))
    assert scores.pop(slot("a", 0)) == 0.5
    assert set(scores.values()) == {0.45}


def test_on_a_hybrid_attach_pod_another_slot_gets_a_conversation_short_of_its_checkpoint() -> None:
    """Past the head (a conversation's slot), attaching lands on the holder's latest checkpoint, about
    CHECKPOINT_GAP before its end: the holder itself wins by that much; the head alone attaches whole."""
    hybrid = state("a", attach=True, resume_anywhere=False)
    req = request(n_blocks=40, shared_blocks=12)
    scores = PrefixMatchScorer("pm").score(req, with_lookup(Lookup(slots={slot("a", 0): 30})),
                                           candidates(hybrid))
    assert scores.pop(slot("a", 0)) == 30 / 40
    assert set(scores.values()) == {(30 - 9 - 0.5) / 40}
    head_only = PrefixMatchScorer("pm").score(req, with_lookup(Lookup(slots={slot("a", 0): 12})),
                                              candidates(hybrid))
    # the head: the holder's checkpoint where the user message starts (resumable counts both short)
    assert head_only[slot("a", 1)] < head_only[slot("a", 0)] and head_only[slot("a", 1)] > 0


def test_prefix_match_counts_a_hybrid_slots_match_short_of_its_checkpoint_gap() -> None:
    """A checkpoint-resuming pod's slot matching only the shared head scores what it can resume from
    (the head less ~9 blocks); past the head (its own conversation) the whole match counts."""
    hybrid, dense = state("a", resume_anywhere=False), state("b")
    lookup = Lookup(slots={slot("a", 0): 30, slot("a", 1): 35, slot("b", 0): 30})
    req = request(n_blocks=40, session_blocks=36, shared_blocks=30)
    scores = PrefixMatchScorer("pm").score(req, with_lookup(lookup), candidates(hybrid, dense))
    assert scores[slot("b", 0)] == 30 / 40
    assert scores[slot("a", 0)] == 21 / 40  # 30 blocks less ceil(2064 / 256) = 9
    assert scores[slot("a", 1)] == 35 / 40


def test_prefix_match_counts_a_hybrid_slot_whole_when_it_holds_this_conversation() -> None:
    """Whole blocks cannot tell a slot holding this conversation's last turn (ending inside the head's
    last block) from another session's: the index's conversation tag can, and that slot counts whole."""
    hybrid = state("a", resume_anywhere=False)
    lookup = Lookup(slots={slot("a", 0): 30, slot("a", 1): 30}, conversation=slot("a", 1))
    req = request(n_blocks=40, session_blocks=36, shared_blocks=30)
    scores = PrefixMatchScorer("pm").score(req, with_lookup(lookup), candidates(hybrid))
    assert scores[slot("a", 0)] == 21 / 40
    assert scores[slot("a", 1)] == 30 / 40


def test_prefix_match_ranks_a_slot_holding_the_exact_head_above_one_that_may_part_inside_it() -> None:
    """Same whole blocks; the index says slot 1 holds this head exactly: its score counts the head's
    characters (and, on a hybrid pod, is not cut short by the checkpoint gap)."""
    head = 30 * 256 + 100
    prompt = make_prompt(MODEL, chain("p", 40), session_prefix_chars=head, shared_chars=head)
    req = SchedRequest("r", MODEL, prompt, None)
    lookup = Lookup(slots={slot("a", 0): 30, slot("a", 1): 30}, exact_head=frozenset({slot("a", 1)}))
    dense = PrefixMatchScorer("pm").score(req, with_lookup(lookup), candidates(state("a")))
    assert dense[slot("a", 0)] == 30 / 40 and dense[slot("a", 1)] == head / (40 * 256)
    hybrid_pod = candidates(state("a", resume_anywhere=False))
    hybrid = PrefixMatchScorer("pm").score(req, with_lookup(lookup), hybrid_pod)
    assert hybrid[slot("a", 0)] == 21 / 40 and hybrid[slot("a", 1)] == head / (40 * 256)


def test_session_affinity_takes_the_indexs_conversation_slot_when_the_request_names_no_session() -> None:
    """Without a session id, the conversation is the session: its last slot is the one the index tags
    with the prompt's conversation, whichever replica served it."""
    a, b = state("a"), state("b")
    scorer = SessionAffinityScorer("sa", SessionAffinityParams())
    cs = with_lookup(Lookup(slots={slot("b", 1): 5}, conversation=slot("b", 1)))
    assert scorer.applies(request(), cs) and list(scorer.nominate(request(), cs)) == [slot("b", 1)]
    scores = scorer.score(request(), cs, candidates(a, b))
    assert scores[slot("b", 1)] == 1.0 and scores[slot("b", 0)] == 0.5 and scores[slot("a", 0)] == 0.0
    assert not scorer.applies(request(), with_lookup(Lookup(slots={slot("b", 1): 5})))


def test_prefix_match_is_zero_when_lookup_is_empty_or_prompt_has_no_blocks() -> None:
    a = state("a")
    assert set(PrefixMatchScorer("pm").score(request(), CycleState(), candidates(a)).values()) == {0.0}
    cs = with_lookup(Lookup(slots={slot("a", 0): 5}))
    assert set(PrefixMatchScorer("pm").score(request(n_blocks=0), cs, candidates(a)).values()) == {0.0}


def test_snapshot_match_prefers_local_over_remote_snapshot() -> None:
    """Same blocks: the pod holding the file scores local_discount, others remote_discount."""
    a, b = state("a"), state("b")
    cs = with_lookup(Lookup(snapshots=(snapshot("s1", "b", 10),)))
    scores = SnapshotMatchScorer("sm", SnapshotMatchParams()).score(
        request(n_blocks=10), cs, candidates(a, b)
    )
    assert scores[slot("b", 0)] == 0.9
    assert scores[slot("a", 0)] == 0.7


def test_snapshot_match_is_zero_for_remote_snapshot_when_pod_has_no_agent() -> None:
    """Pulling from another pod needs this pod's agent."""
    a = state("a", agent=False)
    cs = with_lookup(Lookup(snapshots=(snapshot("s1", "b", 10),)))
    assert set(
        SnapshotMatchScorer("sm", SnapshotMatchParams()).score(request(), cs, candidates(a)).values()
    ) == {0.0}


def test_snapshot_match_is_zero_when_slot_already_holds_as_much() -> None:
    """Restoring what the slot already has gains nothing, so it must not add score."""
    b = state("b")
    cs = with_lookup(Lookup(slots={slot("b", 0): 6}, snapshots=(snapshot("s1", "b", 6),)))
    scores = SnapshotMatchScorer("sm", SnapshotMatchParams()).score(request(n_blocks=10), cs, candidates(b))
    assert scores[slot("b", 0)] == 0.0
    assert scores[slot("b", 1)] == 0.9 * 0.6


def test_snapshot_match_scores_only_what_the_restore_adds_to_the_slot() -> None:
    """prefix-match scores what the slot holds; snapshot-match adds the restore's gain over it, so a
    slot holding less plus a restore never outscores one holding more (with the default weights)."""
    b = state("b")
    cs = with_lookup(Lookup(slots={slot("b", 0): 4, slot("b", 1): 9}, snapshots=(snapshot("s1", "b", 10),)))
    sm = SnapshotMatchScorer("sm", SnapshotMatchParams()).score(request(n_blocks=10), cs, candidates(b))
    pm = PrefixMatchScorer("pm").score(request(n_blocks=10), cs, candidates(b))
    assert sm[slot("b", 0)] == 0.9 * (10 - 4) / 10
    assert sm[slot("b", 1)] == 0.9 * (10 - 9) / 10
    assert sm[slot("b", 2)] == 0.9
    total = {ref: 10 * pm[ref] + 8 * sm[ref] for ref in sm}
    assert total[slot("b", 1)] > total[slot("b", 0)] > total[slot("b", 2)]


def test_snapshot_match_is_zero_when_restore_is_disabled() -> None:
    b = state("b")
    cs = with_lookup(Lookup(snapshots=(snapshot("s1", "b", 10),)))
    cs.write(RESTORE_ENABLED, False)
    assert set(
        SnapshotMatchScorer("sm", SnapshotMatchParams()).score(request(), cs, candidates(b)).values()
    ) == {0.0}


def test_free_slots_scores_idle_fraction_of_the_pod() -> None:
    a, b = state("a", busy=(0, 1, 2)), state("b", busy=(0,))
    scores = FreeSlotsScorer("fs").score(request(), CycleState(), candidates(a, b))
    assert scores[slot("a", 3)] == 0.25
    assert scores[slot("b", 1)] == 0.75


def test_queue_depth_halves_with_one_waiting_request() -> None:
    a, b = state("a", queue=0), state("b", queue=1)
    scores = QueueDepthScorer("qd").score(request(), CycleState(), candidates(a, b))
    assert scores[slot("a", 0)] == 1.0
    assert scores[slot("b", 0)] == 0.5


def test_session_affinity_scores_previous_slot_then_its_pod() -> None:
    """After a decision for session s, s scores 1.0 on that slot, pod_score on its pod, 0 elsewhere."""
    a, b = state("a"), state("b")
    scorer = SessionAffinityScorer("sa", SessionAffinityParams(pod_score=0.4))
    req = request(session_id="s")
    assert set(scorer.score(req, CycleState(), candidates(a, b)).values()) == {0.0}
    scorer.on_decision(req, Decision(b.endpoint, 2, Action.DIRECT, None, 0, "cold"))
    scores = scorer.score(req, CycleState(), candidates(a, b))
    assert scores[slot("b", 2)] == 1.0
    assert scores[slot("b", 0)] == 0.4
    assert scores[slot("a", 2)] == 0.0
    assert set(scorer.score(request(session_id="other"), CycleState(), candidates(a, b)).values()) == {0.0}


def test_session_affinity_forgets_least_recent_session_when_full() -> None:
    """The map is bounded: beyond max_sessions, the least recently decided session is evicted."""
    a = state("a")
    scorer = SessionAffinityScorer("sa", SessionAffinityParams(max_sessions=2))
    for sid in ("s1", "s2", "s3"):
        scorer.on_decision(request(session_id=sid), Decision(a.endpoint, 1, Action.DIRECT, None, 0, "cold"))
    assert scorer.last_slot("s1") is None
    assert scorer.last_slot("s3") == slot("a", 1)


def test_degraded_hash_is_silent_while_index_is_available() -> None:
    a, b = state("a"), state("b")
    scorer = DegradedHashScorer("dh", DegradedHashParams())
    scores = scorer.score(request(session_blocks=4), with_lookup(Lookup()), candidates(a, b))
    assert set(scores.values()) == {0.0}


def test_degraded_hash_scores_one_pod_for_a_prefix_when_index_is_down() -> None:
    """All slots of exactly one pod score 1; the same prefix maps to the same pod every time."""
    eps = [state(n) for n in "abcde"]
    scorer = DegradedHashScorer("dh", DegradedHashParams())
    cs = with_lookup(Lookup(), available=False)
    first = scorer.score(request(session_blocks=4), cs, candidates(*eps))
    winners = {ref.pod_uid for ref, v in first.items() if v == 1.0}
    assert len(winners) == 1
    assert sum(first.values()) == 4.0
    assert scorer.score(request(session_blocks=4), cs, candidates(*eps)) == first


def test_degraded_hash_ignores_text_after_the_session_prefix() -> None:
    """Two sessions sharing the first 4 blocks (the session prefix) land on the same pod."""
    eps = [state(n) for n in "abcdefgh"]
    scorer = DegradedHashScorer("dh", DegradedHashParams())
    one = request("p", 10, session_blocks=4)
    other = request("p", 12, session_blocks=4)
    assert scorer.owner(one, eps) == scorer.owner(other, eps)


def test_degraded_hash_spreads_distinct_prefixes_over_pods() -> None:
    """Consistent hashing spreads keys: 200 prefixes over 4 pods use every pod."""
    eps = [state(n) for n in "abcd"]
    scorer = DegradedHashScorer("dh", DegradedHashParams())
    owners = {scorer.owner(request(f"t{i}", 4, session_blocks=4), eps) for i in range(200)}
    assert owners == {"a", "b", "c", "d"}


def test_degraded_hash_skips_owner_over_bounded_load() -> None:
    """The ring owner carrying far more than the mean is passed over for the next pod on the ring."""
    eps = [state(n) for n in "abcd"]
    scorer = DegradedHashScorer("dh", DegradedHashParams())
    req = request(session_blocks=4)
    owner = scorer.owner(req, eps)
    loaded = [state(n, in_flight=20 if n == owner else 0) for n in "abcd"]
    walk = ring_walk(f"tiny:{req.prompt.session_blocks[-1]}", list("abcd"), 100)
    assert walk[0] == owner
    assert scorer.owner(req, loaded) == walk[1]


def test_ring_walk_moves_only_the_removed_pods_keys() -> None:
    """Removing one pod reassigns only the prefixes it owned (consistent hashing)."""
    keys = [f"k{i}" for i in range(300)]
    before = {k: ring_walk(k, list("abcde"), 100)[0] for k in keys}
    after = {k: ring_walk(k, list("abcd"), 100)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved
    assert all(before[k] == "e" for k in moved)

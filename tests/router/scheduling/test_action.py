"""Action choice: DIRECT / RESTORE / COMPUTE with the pure cost model."""

from __future__ import annotations

import dataclasses

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Action, Endpoint, Lookup, PromptTags, SnapshotRef
from llamafleet_router.scheduling.action import choose_action
from llamafleet_router.scheduling.costs import (
    ActionCosts,
    batches,
    prefill_seconds,
    restore_seconds,
    server_cuts,
)
from llamafleet_router.scheduling.lookup_view import snapshot_tags

from .fakes import MODEL, chain, endpoint, request, slot, snapshot, text_hash
from .fakes import prompt as make_prompt

PROMPT = request(n_blocks=40).prompt  # 40 blocks * 256 chars / 4 = 2560 tokens -> 1.28 s at 2000 tok/s


def test_direct_when_slot_holds_the_pods_best_match() -> None:
    lookup = Lookup(slots={slot("b", 2): 30, slot("b", 0): 10})
    choice = choose_action(PROMPT, endpoint("b"), 2, lookup, ActionCosts())
    assert (choice.action, choice.predicted_blocks, choice.branch) == (Action.DIRECT, 30, "slot_hit")


def test_restore_when_local_snapshot_gives_more_than_the_slot_and_beats_compute() -> None:
    """Slot 1 holds nothing, the pod's best slot is busy; its 4 MB snapshot restores in ~18 ms."""
    lookup = Lookup(slots={slot("b", 2): 30}, snapshots=(snapshot("s", "b", 30),))
    choice = choose_action(PROMPT, endpoint("b"), 1, lookup, ActionCosts())
    assert choice.action is Action.RESTORE
    assert choice.snapshot is not None and choice.snapshot.name == "s"
    assert (choice.predicted_blocks, choice.branch) == (30, "restore")


def test_compute_when_restore_is_disabled() -> None:
    lookup = Lookup(snapshots=(snapshot("s", "b", 30),))
    choice = choose_action(PROMPT, endpoint("b"), 1, lookup, ActionCosts(restore_enabled=False))
    assert (choice.action, choice.snapshot, choice.branch) == (Action.COMPUTE, None, "cold")


def test_direct_when_restore_costs_more_than_the_blocks_it_adds() -> None:
    """A 2-block gain (~64 ms of prefill) does not pay for pulling 1 GB from another pod."""
    lookup = Lookup(slots={slot("b", 1): 28}, snapshots=(snapshot("big", "a", 30, size_bytes=10**9),))
    choice = choose_action(PROMPT, endpoint("b"), 1, lookup, ActionCosts())
    assert (choice.action, choice.snapshot, choice.predicted_blocks) == (Action.DIRECT, None, 28)
    cheap = Lookup(slots={slot("b", 1): 28}, snapshots=(snapshot("small", "a", 30, size_bytes=10**3),))
    assert (
        choose_action(PROMPT, endpoint("b"), 1, cheap, ActionCosts(transfer_overhead_s=0)).action
        is Action.RESTORE
    )


def test_a_restore_that_ties_on_time_wins_on_a_pod_busy_with_other_requests() -> None:
    """Alone, computing 2 blocks (128 tokens, 64 ms) beats an 88 ms restore. With 2 other requests on the
    pod, those 64 ms of prefill delay both of them too, while the restore stalls them only for the
    8 ms the server reads the file: the restore wins, and the pod computes 128 fewer tokens."""
    lookup = Lookup(slots={slot("b", 1): 28}, snapshots=(snapshot("s", "b", 30),))
    costs = ActionCosts(restore_overhead_s=0.08)
    assert choose_action(PROMPT, endpoint("b"), 1, lookup, costs).action is Action.DIRECT
    busy = choose_action(PROMPT, endpoint("b"), 1, lookup, costs, others=2)
    assert busy.action is Action.RESTORE and busy.snapshot is not None and busy.snapshot.name == "s"
    # A restore that is slow for its bytes stalls the others too: then computing stays.
    heavy = Lookup(slots={slot("b", 1): 28}, snapshots=(snapshot("s", "b", 30, size_bytes=60_000_000),))
    assert choose_action(PROMPT, endpoint("b"), 1, heavy, costs, others=2).action is Action.DIRECT


def test_a_remote_snapshot_that_would_have_given_more_is_wanted_here_unless_a_copy_is() -> None:
    """Pulling 1 GB loses to computing 2 blocks, so the slot is used directly; the snapshot is named as
    wanted on this pod (the flow copies it in the background). A copy already here is not wanted, and
    neither is a remote snapshot giving no more than what the choice starts from."""
    big = snapshot("big", "a", 30, size_bytes=10**9)
    choice = choose_action(PROMPT, endpoint("b"), 1, Lookup(slots={slot("b", 1): 28}, snapshots=(big,)),
                           ActionCosts())
    assert (choice.action, choice.wanted) == (Action.DIRECT, big)
    copy = snapshot("big", "b", 30, size_bytes=10**9)
    both = Lookup(slots={slot("b", 1): 28}, snapshots=(big, copy))
    assert choose_action(PROMPT, endpoint("b"), 1, both, ActionCosts()).wanted is None
    short = Lookup(slots={slot("b", 1): 28}, snapshots=(snapshot("s", "a", 20),))
    assert choose_action(PROMPT, endpoint("b"), 1, short, ActionCosts()).wanted is None


def test_compute_for_partial_slot_when_a_busier_slot_of_the_pod_holds_more() -> None:
    """The slot holds 5 of the 30 blocks another slot holds and there is no snapshot: compute the rest."""
    lookup = Lookup(slots={slot("b", 0): 30, slot("b", 1): 5})
    choice = choose_action(PROMPT, endpoint("b"), 1, lookup, ActionCosts())
    assert (choice.action, choice.predicted_blocks) == (Action.COMPUTE, 5)


def test_pod_hit_when_attach_build_shares_the_pods_prefix() -> None:
    lookup = Lookup(slots={slot("b", 0): 30})
    choice = choose_action(PROMPT, endpoint("b", attach=True), 3, lookup, ActionCosts())
    assert (choice.action, choice.predicted_blocks, choice.branch) == (Action.DIRECT, 30, "pod_hit")


def test_prefers_cheaper_local_snapshot_over_larger_remote_pull() -> None:
    """Local 30 blocks vs remote 31 blocks of a 400 MB file: the local one saves more time."""
    lookup = Lookup(snapshots=(snapshot("remote", "a", 31, size_bytes=4 * 10**8), snapshot("local", "b", 30)))
    choice = choose_action(PROMPT, endpoint("b"), 0, lookup, ActionCosts())
    assert choice.snapshot is not None and choice.snapshot.name == "local"


def test_cost_model_is_linear_in_its_parameters() -> None:
    costs = ActionCosts(
        chars_per_token=4, prefill_tokens_per_s=1000, restore_bytes_per_s=1e6, restore_overhead_s=0
    )
    assert prefill_seconds(1000, costs) == 1.0  # 4 blocks of 1,000 characters at 4 per token
    snap = snapshot("s", "b", 1, size_bytes=2_000_000)
    assert restore_seconds(snap, False, costs) == 2.0
    assert (
        restore_seconds(snap, True, costs)
        == 2.0 + 2e6 / costs.transfer_bytes_per_s + costs.transfer_overhead_s
    )


def test_hybrid_slot_holding_only_the_shared_head_restores_the_exact_snapshot_instead() -> None:
    """On a model that resumes only at checkpoints, a slot that matches the prompt's shared head and no
    more holds another session's question after it: the server would resume ~500 tokens early, so
    restoring the head's snapshot (milliseconds) wins. On an attention-only model the slot gives the
    whole head and is used directly."""
    prompt = request(n_blocks=40, session_blocks=30).prompt
    lookup = Lookup(slots={slot("b", 1): 30}, snapshots=(snapshot("head", "b", 30),))
    hybrid = choose_action(prompt, endpoint("b", resume_anywhere=False), 1, lookup, ActionCosts())
    assert (hybrid.action, hybrid.branch) == (Action.RESTORE, "restore")
    assert hybrid.snapshot is not None and hybrid.snapshot.name == "head"
    dense = choose_action(prompt, endpoint("b"), 1, lookup, ActionCosts())
    assert (dense.action, dense.predicted_blocks, dense.branch) == (Action.DIRECT, 30, "slot_hit")


def test_a_pod_whose_server_does_not_reuse_restores_computes_instead() -> None:
    """A snapshot covering the prompt, here or on a peer, is never restored into a pod whose agent found
    restores unused (a sliding-window model: `Endpoint.restores`); its own slot still counts."""
    prompt = request(n_blocks=40, session_blocks=30).prompt
    lookup = Lookup(slots={slot("b", 1): 10},
                    snapshots=(snapshot("here", "b", 30), snapshot("peer", "a", 30)))
    assert choose_action(prompt, endpoint("b"), 1, lookup, ActionCosts()).action == Action.RESTORE
    off = choose_action(prompt, endpoint("b", restores=False), 1, lookup, ActionCosts())
    assert (off.action, off.snapshot, off.predicted_blocks) == (Action.DIRECT, None, 10)


def test_hybrid_slot_holding_this_conversation_past_its_head_is_used_directly() -> None:
    """A later turn whose slot matches past the shared head (its own history) resumes at the checkpoint
    its previous turn left near its end: the whole match counts."""
    prompt = request(n_blocks=40, session_blocks=36, shared_blocks=30).prompt
    lookup = Lookup(slots={slot("b", 1): 35}, snapshots=(snapshot("head", "b", 30),))
    choice = choose_action(prompt, endpoint("b", resume_anywhere=False), 1, lookup, ActionCosts())
    assert (choice.action, choice.predicted_blocks, choice.branch) == (Action.DIRECT, 35, "slot_hit")


def test_hybrid_slot_short_of_its_checkpoint_gap_counts_nothing_and_computes() -> None:
    """Without a snapshot, a hybrid slot matching a few blocks is predicted to give nothing (its
    checkpoints lie before them), so the prediction the verification compares against is honest."""
    prompt = request(n_blocks=40, session_blocks=30).prompt
    lookup = Lookup(slots={slot("b", 1): 5})
    choice = choose_action(prompt, endpoint("b", resume_anywhere=False), 1, lookup, ActionCosts())
    assert (choice.action, choice.predicted_blocks, choice.branch) == (Action.COMPUTE, 0, "cold")


def test_a_head_snapshot_adds_its_last_lines_unless_the_index_says_the_slot_holds_the_head() -> None:
    """The head ends 100 characters into block 31. A slot holding its 30 whole blocks may part from it
    inside that block (another day's date line), so the head's snapshot is weighed (and, cheap, wins);
    a slot the index names as holding this head exactly gains nothing from it and is used directly."""
    head = 30 * 256 + 100
    prompt = make_prompt(MODEL, chain("p", 40), session_prefix_chars=head, shared_chars=head)
    snap = SnapshotRef(name="head", pod_uid="uid-b", n_blocks=30, n_tokens=head // 4, size_bytes=1_000,
                       n_chars=head, text_hash=text_hash(head))
    costs = ActionCosts(restore_overhead_s=0.0)
    parts = Lookup(slots={slot("b", 1): 30}, snapshots=(snap,))
    choice = choose_action(prompt, endpoint("b"), 1, parts, costs)
    assert (choice.action, choice.snapshot) == (Action.RESTORE, snap)
    exact = Lookup(slots={slot("b", 1): 30}, snapshots=(snap,), exact_head=frozenset({slot("b", 1)}))
    choice = choose_action(prompt, endpoint("b"), 1, exact, costs)
    assert (choice.action, choice.branch, choice.snapshot) == (Action.DIRECT, "slot_hit", None)
    hybrid = choose_action(prompt, endpoint("b", resume_anywhere=False), 1, exact, costs)
    assert (hybrid.action, hybrid.predicted_blocks) == (Action.DIRECT, 30)  # the head-end checkpoint


def test_a_slot_holding_a_snapshot_of_the_head_is_tagged_with_the_head_only() -> None:
    """A primed or built slot holding the head's snapshot holds the head exactly; one holding a stage
    before it, or a prompt without tags, gets no tags."""
    head = 30 * 256 + 100
    prompt = make_prompt(MODEL, chain("p", 40), session_prefix_chars=head, shared_chars=head, head_tag="h",
                         conversation_tag="c")
    of_head = SnapshotRef("s", "uid-b", n_blocks=30, n_tokens=1, size_bytes=1, n_chars=head, text_hash="x")
    assert snapshot_tags(prompt, of_head) == PromptTags(head="h", head_blocks=30)
    stage = dataclasses.replace(of_head, n_chars=head - 50)
    assert snapshot_tags(prompt, stage) is None
    untagged = make_prompt(MODEL, chain("p", 40), session_prefix_chars=head, shared_chars=head)
    assert snapshot_tags(untagged, of_head) is None


def _exact(name: str, on: str, n_chars: int) -> SnapshotRef:
    """A snapshot of the prompt's first `n_chars` characters (exact text known, as first sight saves)."""
    return SnapshotRef(name=name, pod_uid=f"uid-{on}", n_blocks=n_chars // 256, n_tokens=n_chars // 4,
                       size_bytes=4_000_000, n_chars=n_chars, text_hash=text_hash(n_chars))


# The small-batch rate is given at the test prompt's own context (40 blocks ~ 2,560 tokens).
CPU = ActionCosts(min_batch_tokens=64, small_batch_context=2_560)


def test_prefill_seconds_runs_at_the_small_batch_rate_below_the_cliff_only() -> None:
    assert prefill_seconds(0, CPU) == 0.0
    assert prefill_seconds(20, CPU) == 20 / CPU.small_batch_tokens_per_s
    # Estimates (from characters) must clear the cliff by a margin: 68 estimated may be 63 real tokens.
    assert prefill_seconds(68, CPU) == 68 / CPU.small_batch_tokens_per_s
    assert prefill_seconds(77, CPU) == 77 / CPU.prefill_tokens_per_s
    assert prefill_seconds(20, ActionCosts()) == 20 / ActionCosts().prefill_tokens_per_s  # rule off
    # Per-row attention slows with the context: half the reference context, twice the rate.
    assert prefill_seconds(20, CPU, context=1_280) == 10 / CPU.small_batch_tokens_per_s


def test_cpu_pod_with_a_short_prompt_keeps_the_closest_snapshot() -> None:
    """At 2,560 tokens of context a 20-token small batch (~40 ms) is cheaper than computing 140 more
    tokens in a full batch (~70 ms at 2,000 tokens/s): the closest snapshot wins, so no tokens are
    computed for nothing on short prompts."""
    lookup = Lookup(snapshots=(_exact("end", "b", 10_160), _exact("stage", "b", 9_680)))
    costs = CPU.model_copy(update={"small_batch_context": 14_000})  # the default: 100 tokens/s at 14K
    choice = choose_action(PROMPT, endpoint("b"), 1, lookup, costs)
    assert choice.action is Action.RESTORE and choice.snapshot is not None and choice.snapshot.name == "end"


def test_cpu_pod_restores_the_stage_that_leaves_a_full_batch_rather_than_the_closest_snapshot() -> None:
    """The prompt is 10,240 characters. The session-end snapshot leaves 20 tokens, which a CPU pod
    computes at decoding speed (~200 ms); a stage 140 tokens earlier leaves a batch the tiled kernel
    takes in ~70 ms. With the rule off (a GPU pod), the closest snapshot wins as before."""
    lookup = Lookup(snapshots=(_exact("end", "b", 10_160), _exact("stage", "b", 9_680)))
    cpu = choose_action(PROMPT, endpoint("b"), 1, lookup, CPU)
    assert cpu.action is Action.RESTORE and cpu.snapshot is not None and cpu.snapshot.name == "stage"
    gpu = choose_action(PROMPT, endpoint("b"), 1, lookup, ActionCosts())
    assert gpu.action is Action.RESTORE and gpu.snapshot is not None and gpu.snapshot.name == "end"


def test_cpu_slot_holding_more_than_any_snapshot_is_used_directly_even_for_a_small_batch() -> None:
    """The slot holds 39 of 40 blocks (a conversation's own slot): 64 tokens are left, a small batch, but
    restoring a snapshot 10 blocks back would compute the turns in between again. Direct, with the
    rule on or off."""
    lookup = Lookup(slots={slot("b", 1): 39}, snapshots=(snapshot("head", "b", 30),))
    for costs in (CPU, ActionCosts()):
        choice = choose_action(PROMPT, endpoint("b"), 1, lookup, costs)
        assert (choice.action, choice.branch) == (Action.DIRECT, "slot_hit")


def test_batches_are_cut_where_the_server_ends_them() -> None:
    assert batches(100, 200, ()) == [100]
    assert batches(100, 200, (196, 150, 50, 250)) == [50, 46, 4]  # cuts outside the range are ignored
    assert batches(150, 200, (150, 196)) == [46, 4]
    assert batches(200, 200, (196,)) == []


def test_server_cuts_only_on_pods_that_checkpoint_and_the_user_cut_only_for_chat_prompts() -> None:
    """10,240 characters at 4 per token: 2,560 tokens, the last user message at 2,540."""
    chat = make_prompt(MODEL, chain("p", 40), session_prefix_chars=10_160)
    raw = make_prompt(MODEL, chain("p", 40), session_prefix_chars=10_160, rendered_by="raw")
    hybrid = endpoint("b", resume_anywhere=False)
    assert server_cuts(chat, endpoint("b"), CPU) == ()
    assert sorted(server_cuts(chat, hybrid, CPU)) == [2560 - 4 - 512, 2540, 2556]
    assert sorted(server_cuts(raw, hybrid, CPU)) == [2560 - 4 - 512, 2556]


def test_hybrid_chat_prompt_restores_the_session_prefix_snapshot_since_its_question_is_a_batch_of_its_own(
) -> None:
    """llama-server computes a hybrid's chat prompt in batches cut where the last user message starts
    and 4 tokens before the end. The question runs below the cliff whatever was restored, so a stage
    120 tokens before the session prefix only adds a batch: the exact snapshot wins. (Measured on the
    seed-table run before this rule: the later-day next session restored a stage leaving 66 tokens,
    364 ms of prompt, where the session-prefix snapshot leaves 19, 116 ms.) An attention-only pod
    computes the whole tail in one batch, so there the stage wins; so it does on a hybrid for a
    completions prompt, which has no message delimiters."""
    lookup = Lookup(snapshots=(_exact("end", "b", 10_160), _exact("stage", "b", 9_680)))
    chat = make_prompt(MODEL, chain("p", 40), session_prefix_chars=10_160)
    raw = make_prompt(MODEL, chain("p", 40), session_prefix_chars=10_160, rendered_by="raw")
    hybrid = endpoint("b", resume_anywhere=False)

    def picked(prompt: PromptIdentity, ep: Endpoint) -> str:
        choice = choose_action(prompt, ep, 1, lookup, CPU)
        assert choice.action is Action.RESTORE and choice.snapshot is not None
        return choice.snapshot.name

    assert picked(chat, hybrid) == "end"
    assert picked(chat, endpoint("b")) == "stage"
    assert picked(raw, hybrid) == "stage"


def test_hybrid_without_the_session_prefix_snapshot_restores_the_stage_leaving_a_full_batch() -> None:
    """A later day: only stages exist. The one 120 tokens before the user message leaves a full batch
    (then the question); the one 40 tokens before it leaves a small batch, slower."""
    lookup = Lookup(snapshots=(_exact("far", "b", 9_680), _exact("near", "b", 10_000)))
    chat = make_prompt(MODEL, chain("p", 40), session_prefix_chars=10_160)
    for ep in (endpoint("b", resume_anywhere=False), endpoint("b")):
        choice = choose_action(chat, ep, 1, lookup, CPU)
        assert choice.snapshot is not None and choice.snapshot.name == "far"

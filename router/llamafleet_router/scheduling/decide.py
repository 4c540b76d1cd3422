"""Action choice for the picked (endpoint, slot): forward directly, restore a snapshot first, or compute.

Rules, in order:

1. RESTORE when restore is enabled and some snapshot restorable into this slot covers strictly more
   blocks than the slot already gives (`lookup_view.held_blocks`), and its estimated restore time beats
   computing the blocks it adds. Among such snapshots, the one with the lowest total time wins.
   Restorable means (`usable_snapshots`): the pod has an agent (restores go through it: it checks the
   fingerprint and the checksum), and the prompt extends the snapshot's exact text STRICTLY
   (`SnapshotRef.extended_by` plus a longer prompt). A hybrid (recurrent) model resumes only from such
   a snapshot, and an exact resend cannot reuse it (the last token is evaluated again). Attention-only
   models could use a partial match up to the common prefix; they get the same rule, for simplicity.
2. DIRECT when the slot gives at least what the best slot of the pod holds, and that is > 0 (`slot_hit`,
   or `pod_hit` on a --slot-attach build where the pod-level prefix is shared).
3. COMPUTE otherwise (`cold`): the prefix, or the part the slot lacks, is computed on the slot.

The cost model is deliberately linear and pure (prefill is superlinear in practice, so it favours
computing slightly; that errs on the side of not moving files around):

    restore_s = size_bytes / restore_bytes_per_s + restore_overhead_s
                (+ size_bytes / transfer_bytes_per_s + transfer_overhead_s when on another pod)
    compute_s(tokens) = the sum, over the batches the server computes the tokens in (`server_cuts`), of
                        batch / prefill_tokens_per_s
                        (batch / small_batch_tokens_per_s when 0 < batch < min_batch_tokens)

and a restore wins when `restore_s + compute_s(tokens left after the snapshot)` beats
`compute_s(tokens left after what the slot holds)`. With `min_batch_tokens` 0 (the default) that is
exactly "the blocks the snapshot adds take longer to compute than the restore takes".

Why a small-batch rate: on llama.cpp's CPU backend a prompt batch of fewer than 64 new tokens takes the
per-row attention kernel, at about decoding speed (`llamafleet_core.devices` has the figures: at 14K
tokens of context 16 new tokens take 190 ms and 64 take 63 ms). So on a CPU fleet a restore that leaves
140 tokens to compute beats one that leaves 20. GPU backends have no such cliff, and neither has the
CPU backend without flash attention (how CPU fleets run: `llamafleet_core.devices`): keep 0 there.
`llamafleet up` sets `devices.CPU_MIN_BATCH_TOKENS` when its llama-server lists no GPU device and the
fleet runs flash attention.

The rate applies per batch, and on pods that checkpoint (hybrid or SWA models) llama-server cuts the
prompt into several batches (`server_cuts`): there the question always runs in a batch of its own, so
the session-prefix snapshot, which leaves nothing before it, beats any earlier stage.

Defaults come from reference measurements: a 14K-token prefix is a ~3.6 MiB file restored in ~5 ms,
while a cold prefill of it takes seconds on CPU and hundreds of ms on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from llamafleet_core.types import Action, Endpoint, Lookup, SnapshotRef
from llamafleet_router.scheduling.framework import Branch, PromptLike
from llamafleet_router.scheduling.lookup_view import (
    held_blocks,
    held_chars,
    pod_best_blocks,
    restorable_snapshots,
    resumable,
    slot_blocks,
)


class ActionCosts(BaseModel):
    """Parameters of the action choice (the `decision:` section of the scheduling config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    restore_enabled: bool = True
    chars_per_token: float = Field(default=4.0, gt=0)  # measured ~4.5 on agent tool JSON; 4 is conservative
    # Where an unknown pod starts: a tiny model's CPU rate (a 14K-token prefill in 4.6-7.5 s,
    # `llamafleet_core.devices`). Kept at the middle of the 50x band learned figures stay in (40 to
    # 100,000 tokens/s: GPU pods learn up to there; the test pods' tiny models learn 9,200). For an
    # unknown pod it only weighs restore against compute, where any figure in that band has a restore
    # of a head (milliseconds) win; first-sight waits assume a slower figure of their own
    # (`snapshots.flow.UNKNOWN_POD_PREFILL_TOKENS_PER_S`): 2,000 there cut real models' waits short.
    prefill_tokens_per_s: float = Field(default=2000.0, gt=0)
    restore_bytes_per_s: float = Field(default=500e6, gt=0)  # local file -> slot
    restore_overhead_s: float = Field(default=0.01, ge=0)
    transfer_bytes_per_s: float = Field(default=100e6, gt=0)  # agent-to-agent pull
    transfer_overhead_s: float = Field(default=0.05, ge=0)
    min_batch_tokens: int = Field(default=0, ge=0)  # below it, prefill runs at the small-batch rate
    # ~decode speed (the per-row kernel) at `small_batch_context` tokens of context; per-row attention
    # slows in proportion to the context, so a 2.7K-token prompt's small batch runs ~5x faster.
    small_batch_tokens_per_s: float = Field(default=100.0, gt=0)
    small_batch_context: int = Field(default=14_000, gt=0)
    # Learn each pod's prefill, restore and pull speeds from its answers (speeds.py); the figures above
    # are then only where a pod starts.
    learn_speeds: bool = True


@dataclass(frozen=True, slots=True)
class ActionChoice:
    action: Action
    snapshot: SnapshotRef | None
    predicted_blocks: int
    branch: Branch
    wanted: SnapshotRef | None = None  # see `wanted_here`


# Token counts here are estimates from characters (`chars_per_token`). The text right before and after
# a session prefix's end (a date line, chat markup, a short question) runs up to ~4.8 characters per
# token, so an estimate must clear the cliff by this factor before a batch counts as full: a stage
# estimated at 68 tokens left 63 real ones in a measured run, and paid the small-batch rate.
_CLIFF_MARGIN = 1.2


def small_batch(tokens: float, costs: ActionCosts) -> bool:
    """Whether a batch of `tokens` (estimated, > 0) new tokens would run below the cliff."""
    return 0 < tokens < costs.min_batch_tokens * _CLIFF_MARGIN


def prefill_seconds(tokens: float, costs: ActionCosts, context: float | None = None) -> float:
    """Estimated time to compute `tokens` (estimated) new prompt tokens in one batch, after about
    `context` tokens (None: the small-batch rate's own reference context). See the module docstring
    for the small-batch rate."""
    if tokens <= 0:
        return 0.0
    if small_batch(tokens, costs):
        scale = 1.0 if context is None else max(context, 1.0) / costs.small_batch_context
        return tokens * scale / costs.small_batch_tokens_per_s
    return tokens / costs.prefill_tokens_per_s


# On a pod it checkpoints (recurrent or SWA memory: `Endpoint.resume_anywhere` False), llama-server ends
# a prompt batch where the last user message starts (chat requests: the template's message delimiters)
# and 4 + n_ubatch and 4 tokens before the prompt's end, to save a checkpoint at each (server-context.cpp,
# llama.cpp PR 20288). Measured on the tiny hybrid at 14K tokens, raw prompts: a 66-token tail (62 + 4)
# takes 260-330 ms, an 84-token one (80 + 4) 85 ms; in chat requests the question is a batch of its own.
CHECKPOINT_TAIL_TOKENS = 4
SERVER_N_UBATCH = 512  # llama-server's default `--ubatch-size`; the pods do not change it


def server_cuts(prompt: PromptLike, endpoint: Endpoint, costs: ActionCosts) -> tuple[float, ...]:
    """Where (in estimated tokens) llama-server ends a batch of this prompt on this pod, past the
    batch-size limit: nowhere on attention-only pods; see above for pods that checkpoint."""
    if endpoint.resume_anywhere:
        return ()
    end = prompt_chars(prompt) / costs.chars_per_token
    cuts = [end - CHECKPOINT_TAIL_TOKENS, end - CHECKPOINT_TAIL_TOKENS - SERVER_N_UBATCH]
    user = getattr(prompt, "session_prefix_chars", 0)
    # Only a prompt rendered with the model's template has the server's message delimiters where we
    # think; a completions prompt has none.
    if getattr(prompt, "rendered_by", "raw") == "template" and isinstance(user, int) and user > 0:
        cuts.append(user / costs.chars_per_token)
    return tuple(cuts)


def batches(start: float, end: float, cuts: tuple[float, ...]) -> list[float]:
    """The sizes of the batches computing tokens `start`..`end` when the server ends one at each cut."""
    sizes, at = [], start
    for cut in sorted(c for c in cuts if start < c < end):
        sizes.append(cut - at)
        at = cut
    if end > at:
        sizes.append(end - at)
    return sizes


def prompt_chars(prompt: PromptLike) -> int:
    """The rendered prompt's length in characters (blocks times their size when the text is unknown)."""
    text = getattr(prompt, "text", None)
    return len(text) if isinstance(text, str) else len(prompt.blocks) * prompt.block_chars


def load_seconds(size_bytes: float, costs: ActionCosts) -> float:
    """Estimated time for llama-server to load a `size_bytes` snapshot file into a slot."""
    return size_bytes / costs.restore_bytes_per_s + costs.restore_overhead_s


def pull_seconds(size_bytes: float, costs: ActionCosts) -> float:
    """Estimated time for a pod's agent to pull a `size_bytes` snapshot from a peer's agent."""
    return size_bytes / costs.transfer_bytes_per_s + costs.transfer_overhead_s


def restore_seconds(snapshot: SnapshotRef, remote: bool, costs: ActionCosts) -> float:
    """Estimated time to get `snapshot` into a slot (pull first when it lives on another pod)."""
    seconds = load_seconds(snapshot.size_bytes, costs)
    if remote:
        seconds += pull_seconds(snapshot.size_bytes, costs)
    return seconds


def extends_strictly(prompt: PromptLike, snap: SnapshotRef) -> bool:
    """Whether the prompt's text strictly extends what `snap` holds (True when either text is unknown:
    identities without text, snapshots recorded without their text hash)."""
    text = getattr(prompt, "text", None)
    if not isinstance(text, str) or not snap.text_hash:
        return True
    hasher = getattr(prompt, "hasher", None)  # PromptIdentity's: the fleet's key, the key's tenant
    return len(text) > snap.n_chars and snap.extended_by(text, hasher if callable(hasher) else None)


def usable_snapshots(
    prompt: PromptLike, endpoint: Endpoint, lookup: Lookup
) -> Iterator[tuple[SnapshotRef, bool]]:
    """`restorable_snapshots` that this pod can restore (it has an agent) and the prompt extends."""
    if endpoint.agent_url is None:
        return
    for snap, remote in restorable_snapshots(lookup, endpoint):
        if extends_strictly(prompt, snap):
            yield snap, remote


def best_restore(
    prompt: PromptLike, endpoint: Endpoint, held: int, usable: list[tuple[SnapshotRef, bool]],
    costs: ActionCosts, others: int = 0, held_chars: int | None = None,
) -> SnapshotRef | None:
    """Of the `usable_snapshots`, the one after whose restore the prompt is ready soonest, if that beats
    computing from what the slot gives (`held_chars`, `lookup_view.held_chars`; the `held` blocks when
    not given); None otherwise.

    `others`: requests in flight on the pod besides this one. llama-server computes a prompt in the
    same batches as their next tokens, so every second of prefill delays each of them by about as
    much, while a restore stalls them only while the server reads the file (not during its pull or
    the agent's round trips). Both sides are weighed with that delay: on a busy pod a restore wins where it
    merely ties on time alone, and the pod computes fewer tokens (the 50-session mixed workload: ~40
    tokens of a head computed again for each session landing on a slot of another workspace's head).

    Only snapshots covering more than the slot gives are weighed, in characters: a snapshot of the head
    ends inside a block, and a slot holding the same whole blocks may part from the head inside the
    last one (a session of another day: its date line), so the snapshot still adds the head's last
    lines there. A slot holding more than any snapshot (a conversation's own slot) is used as it is,
    even where its new turn runs at the small-batch rate, since restoring an earlier point would
    compute the turns in between again (on the mixed workload that rule cost ~10% more prefill tokens
    for no measured gain in time to first token)."""
    best: SnapshotRef | None = None
    total = len(prompt.blocks)
    block_chars = prompt.block_chars
    n_chars = prompt_chars(prompt)
    end = n_chars / costs.chars_per_token
    cuts = server_cuts(prompt, endpoint, costs)

    def after(chars: float) -> float:  # seconds to compute the prompt from `chars` on, batch by batch,
        start = min(chars, n_chars) / costs.chars_per_token  # and the delay that is to the others
        return (1 + others) * sum(prefill_seconds(n, costs, context=end) for n in batches(start, end, cuts))

    from_chars = held * block_chars if held_chars is None else held_chars
    best_time = after(from_chars)
    for snap, remote in usable:
        # The snapshot's exact text past its last whole block counts: of two snapshots ending in the
        # same block, the longer leaves less to compute (the session prefix beats a stage just before).
        covered = min(covered_chars(snap, block_chars), n_chars) if snap.n_blocks <= total else 0
        if covered <= from_chars:
            continue
        stall = others * snap.size_bytes / costs.restore_bytes_per_s  # while the server loads the file
        seconds = restore_seconds(snap, remote, costs) + stall + after(covered)
        # Ties: prefer the local one, then the larger, then by name, so replicas agree.
        if seconds < best_time or (
            best is not None and seconds == best_time and _prefer(snap, best, endpoint.pod.uid)
        ):
            best, best_time = snap, seconds
    return best


def covered_chars(snap: SnapshotRef, block_chars: int) -> int:
    """How much of a prompt extending `snap` it holds: its exact text when known, else whole blocks."""
    return snap.n_chars if snap.n_chars and snap.text_hash else snap.n_blocks * block_chars


def wanted_here(
    prompt: PromptLike, usable: list[tuple[SnapshotRef, bool]], used_chars: int
) -> SnapshotRef | None:
    """Of the `usable_snapshots`, the one on another pod, with no copy on this one, that covers the
    most of this prompt beyond `used_chars` (what the chosen action starts from); None when none does.

    The cost model may rightly prefer computing a few tokens here to pulling it on the request path;
    a copy made in the background serves the next session of this prefix on this pod without either.
    Copying on demand, not every snapshot to every pod, keeps each pod's disk for what its own
    sessions use, and keeps a burst of sessions on the pod that just built their prefix."""
    here = {snap.name for snap, remote in usable if not remote}  # a copy holds the same text
    best: SnapshotRef | None = None
    best_chars = used_chars
    for snap, remote in usable:
        chars = covered_chars(snap, prompt.block_chars)
        if remote and snap.name not in here and chars > best_chars:
            best, best_chars = snap, chars
    return best


def _prefer(a: SnapshotRef, b: SnapshotRef, uid: str) -> bool:
    """True when `a` beats `b` on a tie: local first, then more blocks, then the smaller name."""
    return ((a.pod_uid == uid), a.n_blocks, b.name) > ((b.pod_uid == uid), b.n_blocks, a.name)


def choose_action(
    prompt: PromptLike, endpoint: Endpoint, slot: int, lookup: Lookup, costs: ActionCosts, others: int = 0
) -> ActionChoice:
    """Pure: what to do with the picked slot (see the module docstring for the rules); `others`: the
    requests in flight on the pod besides this one (`best_restore`)."""
    # The index only knows prefixes of this chain, but never predict more than the prompt has.
    total = len(prompt.blocks)
    held = min(held_blocks(lookup, endpoint, slot, prompt), total)
    wanted = None
    if costs.restore_enabled and lookup.snapshots:
        # Checking that the prompt extends a snapshot hashes up to the whole prompt: once per decision.
        usable = list(usable_snapshots(prompt, endpoint, lookup))
        chars = held_chars(lookup, endpoint, slot, prompt, held)
        snap = best_restore(prompt, endpoint, held, usable, costs, others, chars)
        used = covered_chars(snap, prompt.block_chars) if snap is not None else chars
        wanted = wanted_here(prompt, usable, used)
        if snap is not None:
            return ActionChoice(Action.RESTORE, snap, min(snap.n_blocks, total), Branch.RESTORE, wanted)
    pod_best = min(resumable(pod_best_blocks(lookup, endpoint.pod.uid), endpoint, prompt), total)
    if held > 0 and held >= pod_best:
        own = slot_blocks(lookup, endpoint.pod.uid, slot)
        branch = Branch.SLOT_HIT if own >= held else Branch.POD_HIT
        return ActionChoice(Action.DIRECT, None, held, branch, wanted)
    return ActionChoice(Action.COMPUTE, None, held, Branch.COLD, wanted)

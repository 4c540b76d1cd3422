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
    compute_s(blocks) = blocks * block_chars / chars_per_token / prefill_tokens_per_s

Defaults come from reference measurements: a 14K-token prefix is a ~3.6 MiB file restored in ~5 ms,
while a cold prefill of it takes seconds on CPU and hundreds of ms on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from llamafleet_core.types import Action, Endpoint, Lookup, SnapshotRef
from llamafleet_router.scheduling.framework import PromptLike
from llamafleet_router.scheduling.lookup_view import (
    held_blocks,
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
    prefill_tokens_per_s: float = Field(default=2000.0, gt=0)
    restore_bytes_per_s: float = Field(default=500e6, gt=0)  # local file -> slot
    restore_overhead_s: float = Field(default=0.01, ge=0)
    transfer_bytes_per_s: float = Field(default=100e6, gt=0)  # agent-to-agent pull
    transfer_overhead_s: float = Field(default=0.05, ge=0)


@dataclass(frozen=True, slots=True)
class ActionChoice:
    action: Action
    snapshot: SnapshotRef | None
    predicted_blocks: int
    branch: str


def compute_seconds(blocks: float, block_chars: int, costs: ActionCosts) -> float:
    """Estimated prefill time of `blocks` prompt blocks (fractional: a snapshot's exact text may end
    inside a block)."""
    tokens = max(blocks, 0) * block_chars / costs.chars_per_token
    return tokens / costs.prefill_tokens_per_s


def restore_seconds(snapshot: SnapshotRef, remote: bool, costs: ActionCosts) -> float:
    """Estimated time to get `snapshot` into a slot (pull first when it lives on another pod)."""
    seconds = snapshot.size_bytes / costs.restore_bytes_per_s + costs.restore_overhead_s
    if remote:
        seconds += snapshot.size_bytes / costs.transfer_bytes_per_s + costs.transfer_overhead_s
    return seconds


def extends_strictly(prompt: PromptLike, snap: SnapshotRef) -> bool:
    """Whether the prompt's text strictly extends what `snap` holds (True when either text is unknown:
    identities without text, snapshots recorded without their text hash)."""
    text = getattr(prompt, "text", None)
    if not isinstance(text, str) or not snap.text_hash:
        return True
    return len(text) > snap.n_chars and snap.extended_by(text)


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
    prompt: PromptLike, endpoint: Endpoint, held: int, lookup: Lookup, costs: ActionCosts
) -> SnapshotRef | None:
    """The snapshot whose restore saves the most time over computing from `held`, or None if none pays."""
    best: SnapshotRef | None = None
    best_saving = 0.0
    total = len(prompt.blocks)
    for snap, remote in usable_snapshots(prompt, endpoint, lookup):
        if min(snap.n_blocks, total) <= held:
            continue
        # In blocks, but counting the snapshot's exact text past its last whole block: of two snapshots
        # ending in the same block, the longer saves more (the session prefix beats a stage just before).
        covered = snap.n_chars / prompt.block_chars if snap.n_chars and snap.text_hash else snap.n_blocks
        gained = covered - held
        saving = compute_seconds(gained, prompt.block_chars, costs) - restore_seconds(snap, remote, costs)
        # Ties: prefer the local one, then the larger, then by name, so replicas agree.
        if saving > best_saving or (
            best is not None and saving == best_saving and _prefer(snap, best, endpoint.pod.uid)
        ):
            best, best_saving = snap, saving
    return best


def _prefer(a: SnapshotRef, b: SnapshotRef, uid: str) -> bool:
    """True when `a` beats `b` on a tie: local first, then more blocks, then the smaller name."""
    return ((a.pod_uid == uid), a.n_blocks, b.name) > ((b.pod_uid == uid), b.n_blocks, a.name)


def choose_action(
    prompt: PromptLike, endpoint: Endpoint, slot: int, lookup: Lookup, costs: ActionCosts
) -> ActionChoice:
    """Pure: what to do with the picked slot (see the module docstring for the rules)."""
    # The index only knows prefixes of this chain, but never predict more than the prompt has.
    total = len(prompt.blocks)
    held = min(held_blocks(lookup, endpoint, slot, prompt), total)
    if costs.restore_enabled:
        snap = best_restore(prompt, endpoint, held, lookup, costs)
        if snap is not None:
            return ActionChoice(Action.RESTORE, snap, min(snap.n_blocks, total), "restore")
    pod_best = min(resumable(pod_best_blocks(lookup, endpoint.pod.uid), endpoint, prompt), total)
    if held > 0 and held >= pod_best:
        own = slot_blocks(lookup, endpoint.pod.uid, slot)
        return ActionChoice(Action.DIRECT, None, held, "slot_hit" if own >= held else "pod_hit")
    return ActionChoice(Action.COMPUTE, None, held, "cold")

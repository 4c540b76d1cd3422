"""Pure reads of a `Lookup` that several plugins and the action choice share.

Kept apart from the plugins so that plugins stay independent of each other (the layering is
scheduler > plugins > lookup_view/framework) and the "what does this slot / pod / snapshot give" rules
are written once.
"""

from __future__ import annotations

from collections.abc import Iterator

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Endpoint, Lookup, PromptTags, SlotRef, SnapshotRef

# Where llama-server leaves a context checkpoint near the end of each prompt it processes: n_ubatch + 4
# tokens before it (reference/llama-server.md section 3, default n_ubatch 512), at ~4 characters a token.
CHECKPOINT_GAP_CHARS = (512 + 4) * 4


def slot_blocks(lookup: Lookup, pod_uid: str, slot: int) -> int:
    """Leading prompt blocks the index says this slot holds."""
    return lookup.slots.get(SlotRef(pod_uid, slot), 0)


def pod_best_blocks(lookup: Lookup, pod_uid: str) -> int:
    """The most leading blocks any slot of this pod holds (busy or not); not its RAM entries."""
    return max((n for ref, n in lookup.slots.items() if ref.pod_uid == pod_uid and ref.slot >= 0), default=0)


def ram_blocks(lookup: Lookup, endpoint: Endpoint) -> int:
    """The leading blocks of the prompt's head a --cache-prefix pod keeps as a RAM prefix entry, which
    any of its slots loads (recorded under a negative slot, `types.ram_slot`, once the server reported
    it); 0 on other pods."""
    if not endpoint.cache_prefix:
        return 0
    uid = endpoint.pod.uid
    return max((n for ref, n in lookup.slots.items() if ref.slot < 0 and ref.pod_uid == uid), default=0)


def holds_exact_head(lookup: Lookup, endpoint: Endpoint, slot: int, held: int) -> bool:
    """Whether the `held` blocks a request pinned to this slot reuses are this very head, whole: the
    slot holds it exactly (`Lookup.exact_head`), or they come from the pod's RAM entry of it (an entry
    ends where the head does, at the first user message)."""
    exact = lookup.exact_head
    if not exact:
        return False
    uid = endpoint.pod.uid
    if SlotRef(uid, slot) in exact:
        return True
    return endpoint.cache_prefix and held > 0 and any(
        ref.slot < 0 and ref.pod_uid == uid and n == held and ref in exact for ref, n in lookup.slots.items())


def pod_best_slots(lookup: Lookup, pod_uid: str, n_slots: int) -> tuple[tuple[int, ...], int] | None:
    """(slots, blocks): every slot of this pod holding the most (ascending ids) and how much; None if
    none holds anything."""
    most = 0
    slots: list[int] = []
    for ref, n in lookup.slots.items():
        if ref.pod_uid != pod_uid or not 0 <= ref.slot < n_slots or n < most or n <= 0:
            continue
        if n > most:
            most, slots = n, []
        slots.append(ref.slot)
    return (tuple(sorted(slots)), most) if slots else None


def attached_blocks(own: int, pod_best: int, endpoint: Endpoint, prompt: PromptIdentity | None) -> int:
    """What a slot of a --slot-attach pod holding `own` blocks of the prompt reuses when another slot
    holds `pod_best`: its own when that is the most, else the other's by attaching. All of them on a
    model that resumes anywhere; on one that resumes only at checkpoints (with `prompt`), the attach lands
    on the holder's latest checkpoint: for a match past the head (the holder is this conversation's
    slot) about `CHECKPOINT_GAP_CHARS` before its prompt's end, which the 50-session mix paid on every
    turn sent to another slot of the pod (3.1x the minimum prefill against 1.1x)."""
    if own >= pod_best:
        return own
    if endpoint.resume_anywhere or prompt is None:
        return pod_best
    head = prompt.shared_chars // prompt.block_chars
    if pod_best <= head:
        return pod_best
    return max(own, head, pod_best - -(-CHECKPOINT_GAP_CHARS // prompt.block_chars))


def held_blocks(lookup: Lookup, endpoint: Endpoint, slot: int, prompt: PromptIdentity | None = None) -> int:
    """What a request pinned to this slot reuses without restoring anything.

    A patched build with --slot-attach shares the pod's cached prefix with every slot, so there the pod's
    best counts; one with --cache-prefix loads its RAM entry of the head into any slot holding less; an
    upstream build reuses only what this very slot holds. With `prompt`, what the slot can resume from
    (`resumable`) rather than what it holds.
    """
    held = slot_blocks(lookup, endpoint.pod.uid, slot)
    if endpoint.attach:
        held = attached_blocks(held, pod_best_blocks(lookup, endpoint.pod.uid), endpoint, prompt)
    held = max(held, ram_blocks(lookup, endpoint))
    if prompt is None:
        return held
    own = (lookup.conversation == SlotRef(endpoint.pod.uid, slot)
           or holds_exact_head(lookup, endpoint, slot, held))
    return resumable(held, endpoint, prompt, own=own)


def held_chars(lookup: Lookup, endpoint: Endpoint, slot: int, prompt: PromptIdentity, held: int) -> int:
    """What a request pinned to this slot reuses, in characters of its prompt, given the `held` blocks
    it resumes from: those blocks, or the whole head when the index says the slot holds exactly this
    head (`Lookup.exact_head`) and the blocks end where the head's whole blocks do. Only then does a
    snapshot of the head add nothing to the slot; without the tag the slot may part from the head
    inside its last block (another day's date line), and restoring the head may beat computing it."""
    chars = held * prompt.block_chars
    shared = prompt.shared_chars
    if shared > chars and held == shared // prompt.block_chars and \
            holds_exact_head(lookup, endpoint, slot, held):
        return shared
    return chars


def snapshot_tags(prompt: PromptIdentity, snap: SnapshotRef) -> PromptTags | None:
    """The tags of a slot holding exactly `snap`, a prefix of `prompt`: the head's when the snapshot ends
    where the prompt's head does; none otherwise (a conversation's needs its first question)."""
    tags = prompt.tags
    if tags.head and snap.n_chars and snap.n_chars == prompt.shared_chars:
        return PromptTags(head=tags.head, head_blocks=tags.head_blocks)
    return None


def resumable(held: int, endpoint: Endpoint, prompt: PromptIdentity, *, own: bool = False) -> int:
    """Of `held` matching blocks, those a slot of this pod can resume from.

    Attention-only models resume at the exact divergence. A model with recurrent or windowed layers
    (`Endpoint.resume_anywhere` False) resumes only at a context checkpoint. A slot that matches no more
    than the prompt's shared head (tools and system prompt) holds that head followed by another session's
    question, and the server's latest usable checkpoint there lies about `n_ubatch + 4` tokens before that
    question ended (restoring the head's snapshot costs far less than computing that again), so the
    match counts that much short. A slot matching past the head holds this very
    conversation, whose previous turn left a checkpoint just before its end: the match counts whole.

    For chat requests the server also keeps a checkpoint where a conversation's user message starts,
    which is where the shared head ends; but a match of whole blocks cannot tell a slot holding the
    whole head from one that diverges inside its last, partial block (a date line just before the user
    message): counting such matches whole computed far more than needed (docs/design.md,
    "Measurements behind the rules").

    `own`: the index says this slot holds this very head exactly (`Lookup.exact_head`), or this very
    conversation (`Lookup.conversation`: the same head and first question), so it has a checkpoint at
    least where its first question starts, which is where the head ends: the match counts whole.
    Without those tags, a conversation whose turn ended inside the head's last block looked like any
    other session there, and its next turn restored the head and computed its history again.
    """
    if endpoint.resume_anywhere or held <= 0 or own:
        return held
    if held > prompt.shared_chars // prompt.block_chars:
        return held
    return max(0, held - -(-CHECKPOINT_GAP_CHARS // prompt.block_chars))


def restorable_snapshots(lookup: Lookup, endpoint: Endpoint) -> Iterator[tuple[SnapshotRef, bool]]:
    """Snapshots that could be restored into a slot of `endpoint`, with whether they are remote.

    A snapshot on the pod itself is restored by llama-server from its own --slot-save-path. One on
    another pod must first be pulled by this pod's agent, so it needs an agent here. A pod whose server
    does not resume from a restored slot (`Endpoint.restores`) has none.
    """
    if not endpoint.restores:
        return
    for snap in lookup.snapshots:
        if snap.n_blocks <= 0:
            continue
        remote = snap.pod_uid != endpoint.pod.uid
        if remote and endpoint.agent_url is None:
            continue
        yield snap, remote

"""The action rule for the picked (endpoint, slot): forward directly, restore a snapshot first, or compute.

Rules, in order:

1. RESTORE when restore is enabled and some snapshot restorable into this slot covers strictly more
   blocks than the slot already gives (`lookup_view.held_blocks`), and its estimated restore time beats
   computing the blocks it adds (costs.py). Among such snapshots, the one with the lowest total time
   wins. Restorable means (`usable_snapshots`): the pod has an agent (restores go through it: it checks
   the fingerprint and the checksum), and the prompt extends the snapshot's exact text STRICTLY
   (`SnapshotRef.extended_by` plus a longer prompt). A hybrid (recurrent) model resumes only from such
   a snapshot, and an exact resend cannot reuse it (the last token is evaluated again). Attention-only
   models could use a partial match up to the common prefix; they get the same rule, for simplicity.
2. DIRECT when the slot gives at least what the best slot of the pod holds, and that is > 0 (`slot_hit`,
   `pod_hit` on a --slot-attach build where the pod-level prefix is shared, or `ram_hit` where the
   slot gets the head from the RAM prefix entry a --cache-prefix build keeps).
3. COMPUTE otherwise (`cold`): the prefix, or the part the slot lacks, is computed on the slot.

With `min_batch_tokens` 0 (the default) rule 1 is exactly "the blocks the snapshot adds take longer to
compute than the restore takes".

`ActionDecider` applies the rule to the slot placement picked (llm-d's decider plugin): with the index
down nothing is known about slot contents, so the request is forwarded pinned and llama-server reuses
what it has (`degraded_hash`, or `session_affinity` on the session's previous slot); otherwise the rule
weighs the pod's own learned costs (speeds.py) and the requests it already runs. A cold slot that is
the session's previous one is labelled `session_affinity`: that, not the prefix, is why it won.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Action, Endpoint, Lookup, SnapshotRef
from llamafleet_router.scheduling.costs import (
    ActionCosts,
    batches,
    prefill_seconds,
    prompt_chars,
    restore_seconds,
    server_cuts,
)
from llamafleet_router.scheduling.data import (
    INDEX_AVAILABLE,
    LOOKUP,
    NO_LOOKUP,
    Branch,
    CycleState,
    Decision,
    SchedRequest,
    ScoredCandidate,
)
from llamafleet_router.scheduling.lookup_view import (
    held_blocks,
    held_chars,
    pod_best_blocks,
    restorable_snapshots,
    resumable,
    slot_blocks,
)
from llamafleet_router.scheduling.speeds import SpeedBook


@dataclass(frozen=True, slots=True)
class ActionChoice:
    action: Action
    snapshot: SnapshotRef | None
    predicted_blocks: int
    branch: Branch
    wanted: SnapshotRef | None = None  # see `wanted_here`


def extends_strictly(prompt: PromptIdentity, snap: SnapshotRef) -> bool:
    """Whether the prompt's text strictly extends what `snap` holds (True for a snapshot recorded
    without its text hash). Hashed with the prompt's own hasher: the fleet's key, the key's tenant."""
    if not snap.text_hash:
        return True
    return len(prompt.text) > snap.n_chars and snap.extended_by(prompt.text, prompt.hasher)


def usable_snapshots(
    prompt: PromptIdentity, endpoint: Endpoint, lookup: Lookup
) -> Iterator[tuple[SnapshotRef, bool]]:
    """`restorable_snapshots` that this pod can restore (it has an agent) and the prompt extends."""
    if endpoint.agent_url is None:
        return
    for snap, remote in restorable_snapshots(lookup, endpoint):
        if extends_strictly(prompt, snap):
            yield snap, remote


def best_restore(
    prompt: PromptIdentity, endpoint: Endpoint, held: int, usable: list[tuple[SnapshotRef, bool]],
    costs: ActionCosts, others: int = 0, held_chars: int | None = None,
) -> SnapshotRef | None:
    """Of the `usable_snapshots`, the one after whose restore the prompt is ready soonest, if that beats
    computing from what the slot gives (`held_chars`, `lookup_view.held_chars`; the `held` blocks when
    not given); None otherwise.

    `others`: requests in flight on the pod besides this one. llama-server computes a prompt in the
    same batches as their next tokens, so every second of prefill delays each of them by about as
    much, while a restore stalls them only while the server reads the file (not during its pull or
    the agent's round trips). Both sides are weighed with that delay: on a busy pod a restore wins where it
    merely ties on time alone, and the pod computes fewer tokens.

    Only snapshots covering more than the slot gives are weighed, in characters: a snapshot of the head
    ends inside a block, and a slot holding the same whole blocks may part from the head inside the
    last one (a session of another day: its date line), so the snapshot still adds the head's last
    lines there. A slot holding more than any snapshot (a conversation's own slot) is used as it is,
    even where its new turn runs at the small-batch rate, since restoring an earlier point would
    compute the turns in between again (docs/design.md, "Measurements behind the rules")."""
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
    prompt: PromptIdentity, usable: list[tuple[SnapshotRef, bool]], used_chars: int
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
    prompt: PromptIdentity, endpoint: Endpoint, slot: int, lookup: Lookup, costs: ActionCosts, others: int = 0
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
        shared = pod_best_blocks(lookup, endpoint.pod.uid) if endpoint.attach else own
        branch = (Branch.SLOT_HIT if own >= held else Branch.POD_HIT if shared >= held else Branch.RAM_HIT)
        return ActionChoice(Action.DIRECT, None, held, branch, wanted)
    return ActionChoice(Action.COMPUTE, None, held, Branch.COLD, wanted)


class ActionDecider:
    def __init__(self, costs: ActionCosts, speeds: SpeedBook | None, affinity_scorers: Iterable[str]) -> None:
        self._costs = costs
        self._speeds = speeds
        self._affinity = frozenset(affinity_scorers)

    def is_session_slot(self, sc: ScoredCandidate) -> bool:
        """Whether a session-affinity scorer named this candidate the session's previous slot."""
        return any(sc.scores.get(name, 0.0) >= 1.0 for name in self._affinity)

    def decide(
        self, req: SchedRequest, state: CycleState, sc: ScoredCandidate, holder: str | None
    ) -> Decision:
        """The decision for `sc`'s slot, holding the lease of `holder` (None: unleased)."""
        c = sc.candidate
        affinity = self.is_session_slot(sc)
        # Absent means "no index in this profile", as for the degraded-hash scorer.
        if not state.read(INDEX_AVAILABLE, True):
            branch = Branch.SESSION_AFFINITY if affinity else Branch.DEGRADED_HASH
            return Decision(c.endpoint, c.slot, Action.DIRECT, None, 0, branch, holder)
        lookup = state.read(LOOKUP, NO_LOOKUP)
        costs = self._costs if self._speeds is None else self._speeds.costs(c.endpoint.pod.uid)
        choice = choose_action(req.prompt, c.endpoint, c.slot, lookup, costs, others=c.state.in_flight)
        branch = Branch.SESSION_AFFINITY if choice.branch == Branch.COLD and affinity else choice.branch
        return Decision(c.endpoint, c.slot, choice.action, choice.snapshot, choice.predicted_blocks, branch,
                        holder, wanted=choice.wanted, lookup=lookup)

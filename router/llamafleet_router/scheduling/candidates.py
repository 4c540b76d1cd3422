"""Which slots the scheduler scores: pure functions of the lookup, the nominations and the fleet.

Scoring every idle slot of every pod would make the decision O(pods x slots x scorers) (docs/design.md,
"Measurements behind the rules"). But the slots of one pod that the index says the same thing about are
interchangeable to every scorer that reads the index: the index knows nothing else about them. So per
pod the candidates are:

- one slot per distinct run length the lookup reports (slots holding the same number of leading blocks
  of this prompt; sessions of one agent usually hold the same prefix plus their own question, so 150
  matching slots over 32 pods become about 32 candidates);
- one slot per run length among the slots the index says hold this head exactly (`Lookup.exact_head`:
  they score above slots of the same run that may part from the head inside its last block);
- the slot holding this conversation (`Lookup.conversation`) and every slot a `SlotNominator` plugin
  names (session affinity's last slot), each on its own;
- one representative of the slots nothing is known about (the "no prefix here" choice).

The representative of a group is the slot this router released longest ago (`EndpointState.
slot_last_used`; never used first, then the lowest slot id): overwriting a slot loses what it held beyond
this prompt, and the slot used longest ago is the least likely to be continued (with the lowest id
instead, sessions of one agent take each other's slots between two turns). When the representative's lease is
taken by another router replica, the scheduler tries the group's other slots in the same order
(`with_spares`), as scoring every slot would have.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from llamafleet_core.types import Endpoint, Lookup, SlotRef
from llamafleet_router.scheduling.framework import Candidate, EndpointState

# Per pod uid: slot -> group. A group is the run length the lookup gives (> 0; plus `_EXACT` for slots
# holding the head exactly), or a distinct negative value for a slot on its own; a slot absent from the
# map is in group 0 (nothing known).
Groups = dict[str, dict[int, int]]
_EXACT = 1 << 40  # above any run length


def slot_groups(lookup: Lookup, nominated: Iterable[SlotRef]) -> Groups:
    groups: Groups = {}
    exact = lookup.exact_head
    for ref, held in lookup.slots.items():
        group = held + _EXACT if exact and ref in exact else held
        mine = groups.get(ref.pod_uid)
        if mine is None:
            groups[ref.pod_uid] = {ref.slot: group}
        else:
            mine[ref.slot] = group
    own = (lookup.conversation,) if lookup.conversation is not None else ()
    for ref in (*own, *nominated):
        groups.setdefault(ref.pod_uid, {})[ref.slot] = -1 - ref.slot
    return groups


def _by_age(state: EndpointState, slots: Iterable[int]) -> list[int]:
    """`slots`, the one this router released longest ago first (never released first, by id)."""
    if not state.slot_last_used:
        return sorted(slots)
    return sorted(slots, key=lambda slot: (state.released_at(slot), slot))


def oldest(state: EndpointState, slots: Iterable[int]) -> int | None:
    """The first of `_by_age(state, slots)`, for `slots` in ascending order (None when empty). Without
    release times that is the first slot, so a lazy `slots` is read no further."""
    if not state.slot_last_used:
        return next(iter(slots), None)
    return min(slots, key=lambda slot: (state.released_at(slot), slot), default=None)


def candidates(survivors: Iterable[EndpointState], groups: Groups, *, idle_only: bool) -> list[Candidate]:
    """One candidate per (pod, group): idle slots only when `idle_only`, else every slot (queueing).
    With a picker of fixed order the scheduler builds only those that it could place (`pruning.py`)."""
    out: list[Candidate] = []
    for s in survivors:
        uid = s.endpoint.pod.uid
        slots: Sequence[int] = s.idle_slots if idle_only else range(s.endpoint.n_slots)
        mine = groups.get(uid)
        if not mine:
            if (first := oldest(s, slots)) is not None:
                out.append(Candidate(s, first))
            continue
        n, busy = s.endpoint.n_slots, s.busy_slots if idle_only else frozenset()
        # At fleet scale a pod the lookup names mostly holds the prompt in one slot: no sort, no set.
        if len(mine) == 1:
            (slot,) = mine
            if 0 <= slot < n and slot not in busy:
                out.append(Candidate(s, slot))
        else:
            seen: set[int] = set()
            for slot in _by_age(s, mine):
                group = mine[slot]
                if group not in seen and 0 <= slot < n and slot not in busy:
                    seen.add(group)
                    out.append(Candidate(s, slot))
        if (first := oldest(s, [slot for slot in slots if slot not in mine])) is not None:
            out.append(Candidate(s, first))
    return out


def pod_kind(endpoint: Endpoint) -> int:
    """What a slot-level scorer may read of a pod it knows nothing else about (pure): whether it has no
    agent, restores, resumes anywhere, attaches and keeps RAM prefix entries, one bit each. An int,
    not a tuple: every request hashes the kind of every pod it ranks, and a tuple's hash is computed
    anew each time (half of ranking the unknown pods at 1,000 pods)."""
    return ((endpoint.agent_url is None) | endpoint.restores << 1 | endpoint.resume_anywhere << 2
            | endpoint.attach << 3 | endpoint.cache_prefix << 4)


# The kinds whose slots share what the pod holds (--slot-attach, --cache-prefix RAM entries): a slot's
# score there depends on the pod's other slots, not on its own group alone.
SHARING_KINDS = 1 << 3 | 1 << 4


def singled_pods(lookup: Lookup, nominated: Iterable[SlotRef]) -> set[str]:
    """The pods whose candidates are all built even when the scheduler prunes (pure, `pruning.py`): those
    holding a snapshot of the prompt, the conversation's slot or a slot a plugin nominates."""
    own = (lookup.conversation,) if lookup.conversation is not None else ()
    return {snap.pod_uid for snap in lookup.snapshots} | {ref.pod_uid for ref in (*own, *nominated)}


def with_spares(c: Candidate, groups: Groups) -> Iterator[Candidate]:
    """`c`, then the other idle slots of its pod in the same group (they score the same), oldest
    released first."""
    yield c
    mine = groups.get(c.key.pod_uid, {})
    group = mine.get(c.slot, 0)
    if group < 0:  # a nominated slot stands only for itself
        return
    for slot in _by_age(c.state, c.state.idle_slots):
        if slot != c.slot and mine.get(slot, 0) == group:
            yield Candidate(c.state, slot)


def restore_targets(state: EndpointState, slot: int, lookup: Lookup, snapshot_blocks: int) -> list[int]:
    """Idle slots of the pod to restore into instead of `slot`, best first (empty: keep `slot`).

    A restore replaces everything the slot held, so the slot it goes into should be the one whose
    content is least likely to be wanted again, whatever the slot's score was. The picked slot
    scores highest because it holds more of this prompt, which on a busy pod is typically another
    session of the same agent between two turns: restoring over it made that session's next turn
    compute its conversation again (the 50-session mixed workload: ~20 tokens per later turn, half
    of its excess over the minimum). So the restore moves to a slot this router released longer ago
    (never released first), unless the picked slot already holds the whole snapshot (a primed slot:
    the snapshot flow may skip the restore there)."""
    if lookup.slots.get(SlotRef(state.endpoint.pod.uid, slot), 0) >= snapshot_blocks > 0:
        return []
    mine = state.released_at(slot)
    return [s for s in _by_age(state, state.idle_slots) if s != slot and state.released_at(s) < mine]

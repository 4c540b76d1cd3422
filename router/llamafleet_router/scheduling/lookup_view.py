"""Pure reads of a `Lookup` that several plugins and the action choice share.

Kept apart from the plugins so that plugins stay independent of each other (the layering is
scheduler > plugins > lookup_view/framework) and the "what does this slot / pod / snapshot give" rules
are written once.
"""

from __future__ import annotations

from collections.abc import Iterator

from llamafleet_core.types import Endpoint, Lookup, SlotRef, SnapshotRef


def slot_blocks(lookup: Lookup, pod_uid: str, slot: int) -> int:
    """Leading prompt blocks the index says this slot holds."""
    return lookup.slots.get(SlotRef(pod_uid, slot), 0)


def pod_best_blocks(lookup: Lookup, pod_uid: str) -> int:
    """The most leading blocks any slot of this pod holds (busy or not)."""
    return max((n for ref, n in lookup.slots.items() if ref.pod_uid == pod_uid), default=0)


def pod_best_slot(lookup: Lookup, pod_uid: str, n_slots: int) -> tuple[int, int] | None:
    """(slot, blocks) of the slot of this pod holding the most; lowest slot id on ties; None if none."""
    best: tuple[int, int] | None = None
    for ref, n in lookup.slots.items():
        if ref.pod_uid != pod_uid or not 0 <= ref.slot < n_slots or n <= 0:
            continue
        if best is None or n > best[1] or (n == best[1] and ref.slot < best[0]):
            best = (ref.slot, n)
    return best


def held_blocks(lookup: Lookup, endpoint: Endpoint, slot: int) -> int:
    """What a request pinned to this slot reuses without restoring anything.

    A patched build with --slot-attach shares the pod's cached prefix with every slot, so there the pod's
    best counts; an upstream build reuses only what this very slot holds.
    """
    if endpoint.attach:
        return pod_best_blocks(lookup, endpoint.pod.uid)
    return slot_blocks(lookup, endpoint.pod.uid, slot)


def restorable_snapshots(lookup: Lookup, endpoint: Endpoint) -> Iterator[tuple[SnapshotRef, bool]]:
    """Snapshots that could be restored into a slot of `endpoint`, with whether they are remote.

    A snapshot on the pod itself is restored by llama-server from its own --slot-save-path. One on
    another pod must first be pulled by this pod's agent, so it needs an agent here.
    """
    for snap in lookup.snapshots:
        if snap.n_blocks <= 0:
            continue
        remote = snap.pod_uid != endpoint.pod.uid
        if remote and endpoint.agent_url is None:
            continue
        yield snap, remote

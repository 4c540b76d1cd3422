"""A request's hold on a slot, and its one release.

Holding a slot means two things: the request is counted in flight on the slot (the scheduler sees the
slot busy and the pod loaded), and, when the scheduler took one, this replica holds the slot's lease
(other replicas keep off it). Every path that ends a request gives both back through `SlotClaim.release`,
exactly once: the answer's end, a pod that refused the connection before anything was sent, a cancel
while a snapshot step ran, a background build's end.

The release is split as the proxy needs it (proxy/forward.py): the in-flight count and the local lease
are given back synchronously, so a cancelled request can release from a `finally` and the client's next
turn, which often arrives before the answer's background work ran, finds the slot free; the lease in
the store goes in a background task, after `first` (the index record of what the slot now holds:
another replica can take the slot only once the lease is gone, and must find the record there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from llamafleet_core.types import Endpoint
from llamafleet_router.background import TaskSet
from llamafleet_router.fleet.leases import ReplicaLeases
from llamafleet_router.fleet.state import InFlight
from llamafleet_router.scheduling.framework import ANY_SLOT, Decision

log = logging.getLogger(__name__)

# The store's lease is given back within this, or left to its TTL (at shutdown the store may be gone).
LEASE_RELEASE_S = 5.0

ReleaseLease = Callable[[Decision], Awaitable[None]]


async def _run(work: Awaitable[None]) -> None:
    await work


class SlotClaim:
    """One request's hold on `slot` of `endpoint` (`ANY_SLOT`: on the pod, the server picks the slot),
    with the lease `decision` took, when it took one."""

    def __init__(
        self, claims: Claims, endpoint: Endpoint, slot: int, decision: Decision | None,
    ) -> None:
        self._claims = claims
        self.endpoint = endpoint
        self.slot = slot
        self._decision = decision
        self.released = False

    @property
    def decision(self) -> Decision:
        """The scheduling decision the claim holds the slot for (a claim on a pod has none)."""
        if self._decision is None:
            raise RuntimeError("a claim on a pod holds no scheduling decision")
        return self._decision

    def update(self, decision: Decision) -> None:
        """A snapshot step changed what to do first in the slot (restore, compute): the slot and its
        lease stay the same."""
        held = self.decision
        if (decision.endpoint.uid, decision.slot, decision.lease_holder) != (
                held.endpoint.uid, held.slot, held.lease_holder):
            raise ValueError("a claim keeps its slot and lease: claim the other slot instead")
        self._decision = decision

    def release(self, first: Awaitable[None] | None = None) -> None:
        """Give the slot back: now in flight and locally, then the store's lease after `first` has run.
        Later calls do nothing (and close `first` unrun)."""
        if self.released:
            if asyncio.iscoroutine(first):
                first.close()
            return
        self.released = True
        claims, decision = self._claims, self._decision
        claims.in_flight.end(self.endpoint.uid, self.endpoint.url, self.slot)
        if decision is None or decision.lease_holder is None:
            if first is not None:
                claims.tasks.spawn(_run(first), name="after-release")
            return
        if claims.leases is not None:
            claims.leases.relinquish(decision.slot_ref, decision.lease_holder)
        claims.tasks.spawn(claims.give_back_lease(decision, first), name="release")


class Claims:
    """Makes the claims of one gateway: counted on its `in_flight`, leases given back through
    `release_lease` (the scheduler's `release`, which never raises)."""

    def __init__(
        self, *, in_flight: InFlight, tasks: TaskSet, release_lease: ReleaseLease,
        leases: ReplicaLeases | None = None,
    ) -> None:
        self.in_flight = in_flight
        self.tasks = tasks
        self.leases = leases  # the replica's local holders, when the app built the scheduler itself
        self._release_lease = release_lease

    def claim(self, decision: Decision) -> SlotClaim:
        """Hold the decided slot (its lease, when taken, was taken by the scheduler)."""
        self.in_flight.begin(decision.endpoint.uid, decision.endpoint.url, decision.slot)
        return SlotClaim(self, decision.endpoint, decision.slot, decision)

    def claim_pod(self, endpoint: Endpoint) -> SlotClaim:
        """Count a request on a pod that takes no slot of its own choosing (count_tokens, embeddings)."""
        self.in_flight.begin(endpoint.uid, endpoint.url, ANY_SLOT)
        return SlotClaim(self, endpoint, ANY_SLOT, None)

    def unclaimed(self, decision: Decision) -> None:
        """Give back a lease the scheduler took for a decision nobody claims (a lender that found the
        slot unusable)."""
        if decision.lease_holder is not None:
            self.tasks.spawn(self.give_back_lease(decision, None), name="release")

    async def give_back_lease(self, decision: Decision, first: Awaitable[None] | None) -> None:
        try:
            if first is not None:
                await first
        except Exception:
            log.exception("work before a lease's release failed", extra={"slot": decision.slot_ref.key()})
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LEASE_RELEASE_S):
                await self._release_lease(decision)

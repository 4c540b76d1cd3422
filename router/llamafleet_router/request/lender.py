"""Idle slots lent to background work: a detached first-sight build, priming a snapshot ahead of demand.

A lent slot is claimed like a request's (request/claim.py): counted in flight and leased, so the
scheduler pins no request to it meanwhile, and given back by the borrower through the claim's one
release. The slot is chosen by the scheduler itself, for the build's prompt, so the build goes where
its prefix is held and the lease rules are the requests' rules.
"""

from __future__ import annotations

import dataclasses

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.types import Endpoint
from llamafleet_router.discovery.base import Discovery
from llamafleet_router.errors import ApiError
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight, endpoint_states
from llamafleet_router.request.after import SchedulerLike
from llamafleet_router.request.claim import Claims, SlotClaim
from llamafleet_router.scheduling.framework import ANY_SLOT, Branch, NoEndpointError, SchedRequest


class SlotLender:
    """Lends idle slots of the model's pods (`snapshots.detached.SlotLender`)."""

    def __init__(
        self, *, discovery: Discovery, scheduler: SchedulerLike, claims: Claims, in_flight: InFlight,
        owners: ModelOwners,
    ) -> None:
        self._discovery = discovery
        self._scheduler = scheduler
        self._claims = claims
        self._in_flight = in_flight
        self._owners = owners

    async def lend(
        self, req: SchedRequest, *, pod_uid: str | None = None, min_idle: int = 1,
        avoid: frozenset[int] = frozenset(),
    ) -> SlotClaim | None:
        """An idle slot for a build of `req`'s prompt, claimed; None when there is none (the caller
        builds in its own slot, or not at all). With `pod_uid`, on that pod only, and only while it
        has `min_idle` idle slots; never one of the slots in `avoid` (they count as idle: requests may
        take them, and the borrower wants another)."""
        build = SchedRequest(f"{req.request_id}/build", req.model, req.prompt, None)
        pods = [p for p in await self._discovery.endpoints() if pod_uid is None or p.endpoint.uid == pod_uid]
        try:
            states = endpoint_states(req.model, self._owners.pick(req.model, pods), self._in_flight)
            roomy = [s for s in states if len(s.idle_slots) >= min_idle]
            states = [dataclasses.replace(s, busy_slots=s.busy_slots | avoid) if avoid else s for s in roomy]
            if not states:
                return None
            decision = await self._scheduler.schedule(build, states)
        except (NoEndpointError, IndexUnavailable, ApiError):  # ApiError: no pod, or a model conflict
            return None
        queued = decision.branch == Branch.QUEUED
        if decision.slot == ANY_SLOT or queued or decision.endpoint.agent_url is None:
            self._claims.unclaimed(decision)
            return None
        return self._claims.claim(decision)

    async def idle_pods(self, req: SchedRequest, pod_uid: str) -> list[Endpoint]:
        """The ready pods of `req`'s model with an idle slot now (this replica's view: its requests in
        flight and the pods' own busy slots), but `pod_uid`. Nothing is claimed."""
        try:
            pods = self._owners.pick(req.model, await self._discovery.endpoints())
            states = endpoint_states(req.model, pods, self._in_flight, frozenset({pod_uid}))
        except ApiError:  # no other pod, or a model two fleets claim
            return []
        return [s.endpoint for s in states if s.healthy and s.idle_slots]


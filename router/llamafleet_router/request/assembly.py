"""Building the request director whole, once the app's lifespan has its HTTP client, discovery and
scheduler: every collaborator exists before the first request, none is filled in later.

The order is the dependency order: the slot claims give leases back through the after-response
hook, the lender claims slots, the snapshot flow borrows from the lender, and the director runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamafleet_core.index.base import PrefixIndex
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.background import IndexHealth, TaskSet
from llamafleet_router.discovery.base import Discovery
from llamafleet_router.fleet.leases import ReplicaLeases
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.request.after import AfterResponse, SchedulerLike
from llamafleet_router.request.claim import Claims
from llamafleet_router.request.director import Director, Upstream
from llamafleet_router.request.lender import SlotLender
from llamafleet_router.snapshots import SnapshotConfig, SnapshotFlow, SnapshotMetrics


@dataclass(frozen=True)
class Fixed:
    """What the gateway holds from its construction on: the parts of a director that need no client."""

    in_flight: InFlight
    tasks: TaskSet
    owners: ModelOwners
    tenancy: Tenancy
    metrics: RouterMetrics
    health: IndexHealth
    retries: int
    block_chars: int
    chars_per_token: float
    snapshots: tuple[SnapshotConfig, SnapshotMetrics] | None = None  # on when configured


def assemble(
    fixed: Fixed, *, upstream: Upstream, discovery: Discovery, scheduler: SchedulerLike, index: PrefixIndex,
    leases: ReplicaLeases | None,
) -> Director:
    """The director over the running collaborators. `leases`: the replica's, when the app built the
    scheduler itself. The scheduler's learned per-pod speeds, when it has them, learn from answers and
    restores too."""
    speeds = scheduler.speeds
    after = AfterResponse(index=index, scheduler=scheduler, metrics=fixed.metrics, health=fixed.health,
                          block_chars=fixed.block_chars, chars_per_token=fixed.chars_per_token, speeds=speeds)
    claims = Claims(in_flight=fixed.in_flight, tasks=fixed.tasks, release_lease=after.release, leases=leases)
    flow = None
    if fixed.snapshots is not None:
        config, metrics = fixed.snapshots
        lender = SlotLender(discovery=discovery, scheduler=scheduler, claims=claims,
                            in_flight=fixed.in_flight, owners=fixed.owners)
        flow = SnapshotFlow(http=upstream.http, index=index, config=config, metrics=metrics,
                            tasks=fixed.tasks, speeds=speeds, lender=lender)
        # A Redis that comes back empty lost the snapshot entries; the agents still hold the files.
        fixed.health.on_recovered.append(flow.resync.forget_all)
    return Director(
        upstream=upstream, discovery=discovery, scheduler=scheduler, after=after, claims=claims,
        snapshots=flow, in_flight=fixed.in_flight, owners=fixed.owners, tenancy=fixed.tenancy,
        metrics=fixed.metrics, health=fixed.health, tasks=fixed.tasks, retries=fixed.retries,
    )

"""Snapshots in the gateway: restore-on-miss, first-sight single flight with stage and divergence
points, and re-recording a restarted pod's snapshots. `SnapshotFlow` is the entry point; the gateway
calls `resync.ensure(pods)` before scheduling and `prepare(req, decision, pods)` before forwarding."""

from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics
from llamafleet_router.snapshots.flow import SnapshotFlow

__all__ = ["SnapshotConfig", "SnapshotFlow", "SnapshotMetrics"]

"""Warming SharedPrefixes: compute a declared prefix once, snapshot it, ship it to every pod.

Used by `llamafleet up` (local fleets) and by the operator's SharedPrefix reconcile, through the same
functions:

- `render_prefix(source, template)`, `snapshot_name(source, text_hash)`: pure;
- `warm_shared_prefix(source, pods, ...) -> WarmResult`: seed on one pod, pull everywhere, index it;
- `warm_pod(result, source, pod, peers=...) -> PodWarmState`: a pod that started later;
- `remove_shared_prefix(result_or_name, pods, ...)`: delete the snapshots and their index entries.

Readiness (a pod is not routable before it holds its fleet's SharedPrefix snapshots): agents started
with `--await-required` answer `GET /ready` with 503 until told which snapshots they need, then until
they hold all of them (the body names the missing ones). The warmer declares the whole set with
`declare_required(pods, names)` (or `AgentClient.set_required`) before or after warming; the agent
keeps it in its snapshot folder across restarts and never evicts a required snapshot.

Order on a spec change (new text, new snapshot name): warm the new snapshot, declare the new set, then
remove the old snapshot; on delete: declare the set without it, then remove it.
"""

from llamafleet_core.prefix import BLOCK_CHARS
from llamafleet_core.warming.model import PodWarmState, PrefixSource, WarmError, WarmPod, WarmResult
from llamafleet_core.warming.pods import declare_required, remove_shared_prefix, warm_pod
from llamafleet_core.warming.render import prefix_blocks, prefix_body, render_prefix, snapshot_name
from llamafleet_core.warming.warm import warm_shared_prefix

__all__ = [
    "BLOCK_CHARS",
    "PodWarmState",
    "PrefixSource",
    "WarmError",
    "WarmPod",
    "WarmResult",
    "declare_required",
    "prefix_blocks",
    "prefix_body",
    "remove_shared_prefix",
    "render_prefix",
    "snapshot_name",
    "warm_pod",
    "warm_shared_prefix",
]

"""The agent's Prometheus metrics, on a registry the app's owner passes in (one per app, none global)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ops = Counter(
            "llamafleet_agent_operations_total",
            "Snapshot operations by kind (save, pull, restore, serve, delete) and outcome.",
            ["op", "outcome"],
            registry=registry,
        )
        self.refusals = Counter(
            "llamafleet_agent_refusals_total",
            "Requests refused, by reason (fingerprint, checksum, size, name, symlink, auth, ...).",
            ["reason"],
            registry=registry,
        )
        self.untrusted = Counter(
            "llamafleet_agent_untrusted_snapshots_total",
            "Snapshots refused and deleted as untrusted, by reason: signature (a manifest no agent "
            "signed), checksum or size (a file that is not the one its manifest names), restore (the "
            "server read another file than the one verified), peer (a peer's manifest not signed).",
            ["reason"],
            registry=registry,
        )
        self.bytes = Counter(
            "llamafleet_agent_bytes_total",
            "Snapshot bytes saved, pulled from peers, and served to peers.",
            ["direction"],
            registry=registry,
        )
        self.duration = Histogram(
            "llamafleet_agent_operation_seconds",
            "Wall time of snapshot operations, including verification.",
            ["op"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.evictions = Counter(
            "llamafleet_agent_evictions_total",
            "Snapshots deleted to stay under the byte budget.",
            ["pinned"],
            registry=registry,
        )
        self.stored_bytes = Gauge(
            "llamafleet_agent_stored_bytes", "Bytes of snapshot files in the folder.", registry=registry
        )
        self.stored_count = Gauge(
            "llamafleet_agent_snapshots", "Snapshots in the folder.", registry=registry
        )
        # Pinned snapshots are the SharedPrefix ones (the operator's warming saves and pulls them pinned;
        # eviction takes them last): how many prefixes this pod holds warm, unlike the count above, which
        # also counts conversation snapshots the gateway saved.
        self.pinned_count = Gauge(
            "llamafleet_agent_pinned_snapshots",
            "Pinned snapshots in the folder: the SharedPrefix snapshots this pod holds warm.",
            registry=registry,
        )
        self.pinned_bytes = Gauge(
            "llamafleet_agent_pinned_bytes", "Bytes of the pinned (SharedPrefix) snapshots in the folder.",
            registry=registry,
        )
        self.features_known = Gauge(
            "llamafleet_agent_server_features_known",
            "1 once this pod's llama-server help text was read and recognised, else 0.",
            registry=registry,
        )
        self.server_feature = Gauge(
            "llamafleet_agent_server_feature",
            "1 when this pod's llama-server build accepts the prefix-sharing flag of `feature`.",
            ["feature"],
            registry=registry,
        )

"""Configuration and metrics of the gateway's snapshot work (restore-on-miss, first sight, resync).

The metrics object registers on the app's own registry (`RouterMetrics.registry`), so the gateway's
`/metrics` shows it with no change to `RouterMetrics`. Labels are bounded: results, failure kinds (the
agent's own small vocabulary) and snapshot kinds; never a snapshot name or a prompt hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from llamafleet_core.agent_tokens import AgentTokens
from llamafleet_router.settings import RouterSettings

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class SnapshotConfig:
    """What the snapshot flow needs from the router settings. `token` is secret: never log this object's
    fields one by one, and its repr hides the token."""

    token: str
    block_chars: int = 256
    first_sight_min_chars: int = 2048
    first_sight_wait_s: float = 900.0  # the most a request waits for another's build (`wait_limit`)
    first_sight_wait_min_s: float = 10.0  # the least it waits, however fast the build is expected
    stages: int = 4
    resync_timeout_s: float = 3.0  # a pod's first request waits at most this for its snapshots' re-listing
    resync_interval_s: float = 0.25  # how often the gateway looks for pods to re-list without a request
    ship: bool = True  # copy a snapshot to a pod whose sessions want it, in the background (ship.py)
    prime_slots: int = 2  # idle slots of its pod a new session prefix is loaded into at once (prime.py)
    learned_cuts: int = 4  # cuts a head's build saves from its family's divergence points (divergence.py)
    # Per-namespace agent tokens (fleets discovered through the membership); None: `token` for every agent.
    tokens: AgentTokens | None = None
    # llama-server's own API key (settings' `pod_api_key`): first-sight prefills and primes call the pods.
    pod_api_key: str | None = None

    def __repr__(self) -> str:
        return (f"SnapshotConfig(token=***, block_chars={self.block_chars}, "
                f"first_sight_min_chars={self.first_sight_min_chars}, stages={self.stages}, "
                f"learned_cuts={self.learned_cuts})")

    def agent_token(self, agent_url: str) -> str:
        """The token to present to the agent at `agent_url` (its namespace's, see agent_tokens.py)."""
        return self.tokens.for_agent(agent_url) if self.tokens is not None else self.token

    @property
    def min_gap(self) -> int:
        """Stage points closer than this (in characters) save too little to be worth a snapshot."""
        return 2 * self.block_chars

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> SnapshotConfig | None:
        """None when no agent token is configured: snapshots are then off (plain prefix routing)."""
        token = settings.resolved_agent_token()
        if token is None:
            return None
        return cls(
            token=token, block_chars=settings.block_chars,
            first_sight_min_chars=settings.first_sight_min_chars,
            first_sight_wait_s=settings.first_sight_wait_s,
            first_sight_wait_min_s=settings.first_sight_wait_min_s, stages=settings.snapshot_stages,
            ship=settings.ship_snapshots, prime_slots=settings.prime_slots,
            pod_api_key=settings.resolved_pod_api_key(),
            # Pods from the membership live in namespaces, each with its own derived token; static pods
            # (local fleets) take the configured token as it is.
            tokens=AgentTokens(token, per_namespace=settings.discovery == "redis"),
        )


class SnapshotMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "llamafleet_router_snapshot_"
        self.restores = Counter(
            p + "restores_total", "Snapshot restores before forwarding, by where the snapshot came from "
            "(local, peer) and result (ok, failed).", ["source", "result"], registry=registry,
        )
        self.failures = Counter(
            p + "failures_total", "Snapshot operations that failed and fell back to computing, by "
            "operation (pull, restore, prefill, save, resync, ship) and the agent's failure kind.",
            ["op", "kind"], registry=registry,
        )
        self.saves = Counter(
            p + "saves_total", "Snapshots saved by the gateway, by kind (fs: first sight of a session "
            "prefix, st: stage point, dv: divergence point).", ["kind"], registry=registry,
        )
        self.first_sight = Counter(
            p + "first_sight_total", "Requests whose session prefix the fleet had not seen, by role: "
            "leader (prefilled and saved it), waiter (waited for the leader's snapshot), stage_waiter (for a "
            "stage another head's build shares), attach (forwarded to the --slot-attach pod building it) "
            "or moved (a waiter that left the building pod for an idle one expected to compute it sooner).",
            ["role"],
            registry=registry,
        )
        self.ships = Counter(
            p + "ships_total", "Snapshots copied in the background to a pod whose sessions wanted them, by "
            "result (ok, failed).", ["result"], registry=registry,
        )
        self.primes = Counter(
            p + "primes_total", "Idle slots loaded in the background with a session prefix just built "
            "(prime.py), by result: loaded, held (the slot had it), no_slot (no spare idle slot), failed; "
            "and used: a request pinned to a primed slot skipped its restore.", ["result"],
            registry=registry,
        )
        self.resynced = Counter(
            p + "resynced_total", "Snapshots recorded again from an agent's listing (pod (re)appeared).",
            registry=registry,
        )
        self.restore_seconds = Histogram(
            p + "restore_seconds", "Pull (when remote) plus restore, as the gateway waited for it.",
            ["source"], buckets=_SECONDS, registry=registry,
        )
        # Named for the router, not the snapshot machinery: a head that cannot fit is the user's concern.
        self.head_too_long = Counter(
            "llamafleet_router_head_too_long_total", "Requests whose head (shared prefix) has at least "
            "as many tokens as the slot context of its pod: no first-sight build was tried (branch "
            "head_exceeds_context), by model.", ["model"], registry=registry,
        )
        self.first_sight_seconds = Histogram(
            p + "first_sight_seconds", "Staged prefill and saves of a new session prefix.",
            buckets=_SECONDS, registry=registry,
        )


# Failure kinds that say the snapshot itself is bad or gone: its index entry is dropped so that no
# other request tries it again (the agent refuses it anyway; this saves the round trip).
BAD_SNAPSHOT_KINDS = frozenset({"checksum", "size", "tokens", "not_found", "symlink", "restore", "name",
                                "signature"})


def failure_kind(kind: str, status: int | None, known: Mapping[int, str] | None = None) -> str:
    """A bounded label for an agent failure: its own kind, or one from the HTTP status."""
    if kind:
        return kind[:32]
    if status is None:
        return "unreachable"
    table = known or {401: "auth", 403: "auth", 404: "not_found", 413: "too_large"}
    return table.get(status, f"http_{status // 100}xx")

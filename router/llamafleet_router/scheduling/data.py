"""The data one scheduling cycle reads, shares and returns: the request, each endpoint's state, the
per-request CycleState and its keys, the slot candidates, the decision, and the structural collaborators
the request and the index are typed by.

Kept apart from the plugin contracts (`framework.py`) because far more code reads these types than
writes plugins: the gateway, the snapshot flow, the hooks and discovery only need the request, the
endpoint state and the decision. `framework` re-exports every name, so either import works.

Scoring happens at SLOT level: a candidate is one idle slot of one surviving endpoint, keyed by its
`SlotRef`. llama-server reuses a prefix only inside the slot a request is pinned to, so "which pod" is
not enough: the pipeline must say which slot. Not every idle slot is a candidate, though: per pod, the
slots the index lookup names, the slots a `SlotNominator` plugin names (session affinity's last slot),
and ONE representative of the rest (its lowest idle slot). The rest score exactly like their
representative for every built-in scorer (nothing is known to be in them), so scoring them would only
cost time: 32 pods of 32 slots would be 768 candidates instead of about 32 plus the hits.

Collaborators are declared here as minimal Protocols (structural typing) instead of being imported from
`llamafleet_core.index` or `llamafleet_core.prefix`: the scheduler only needs these few attributes, tests
can pass tiny fakes, and this module stays importable whatever the concrete classes look like.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Action, Endpoint, Lookup, PromptTags, SlotRef, SnapshotRef

T = TypeVar("T")

# `Decision.slot` for "let llama-server choose": a queued request that no slot holds a prefix for gains
# nothing from being pinned to one busy slot, and -1 is llama-server's own "any slot" value for id_slot.
ANY_SLOT = -1

# What a plugin reads for LOOKUP when no producer wrote it: one shared, read-only empty lookup.
NO_LOOKUP = Lookup()


# ---- collaborators (structural) --------------------------------------------------------------------


class PrefixIndexLike(Protocol):
    """The read side of `llamafleet_core.index.base.PrefixIndex`; raises when the index is unavailable."""

    async def lookup(self, model: str, blocks: tuple[str, ...], tags: PromptTags | None = None, /) -> Lookup:
        ...


class SlotLeasesLike(Protocol):
    """`llamafleet_core.index.base.SlotLeases`: a slot pinned by one router replica at a time."""

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float, /) -> bool: ...

    async def release(self, slot: SlotRef, holder: str, /) -> None: ...


class Branch(StrEnum):
    """Why a request went where it went: the `branch` label of `llamafleet_router_decisions_total` and the
    second half of the `x-llamafleet-action` header (docs/design.md, "Glossary"). A `StrEnum`, so a
    metric label or a header is its value as is."""

    # the scheduler's (action.py, placement.py)
    SLOT_HIT = "slot_hit"  # the picked slot holds the prompt's longest known part
    # forwarded to a slot holding less than the pod's best, on a --slot-attach pod (it shares its
    # cached prefix with every slot)
    POD_HIT = "pod_hit"
    # forwarded to a slot holding less than the head a --cache-prefix pod keeps in RAM: the server loads
    # its prefix entry into the slot
    RAM_HIT = "ram_hit"
    RESTORE = "restore"  # a snapshot is restored into the slot first
    COLD = "cold"  # nothing known holds any of it: computed
    SESSION_AFFINITY = "session_affinity"  # the session's last slot, nothing better known
    DEGRADED_HASH = "degraded_hash"  # the index is down: a hash of the prefix steers
    DEGRADED_FALLBACK = "degraded_fallback"  # the scheduler failed with the index: least loaded pod
    QUEUED = "queued"  # no idle slot: forwarded to wait on the pod
    # the snapshot steps' (snapshots/)
    PRIMED = "primed"  # the snapshot was loaded into the slot ahead of demand
    RESTORE_FAILED = "restore_failed"  # a restore failed: computed instead
    FIRST_SIGHT = "first_sight"  # this request built its head's snapshots in its slot
    FIRST_SIGHT_WAIT = "first_sight_wait"  # waited for another request's build, restored it
    RESTORE_FIRST_SIGHT = "restore_first_sight"  # built on top of a restored stage
    RESTORE_STAGE_WAIT = "restore_stage_wait"  # waited for a stage another head shares, restored it
    FIRST_SIGHT_DETACHED = "first_sight_detached"  # head built in a borrowed slot; forwarded at once
    RESTORE_FIRST_SIGHT_DETACHED = "restore_first_sight_detached"  # the same, from a restored stage
    # another request builds the head on this --slot-attach pod: forwarded at once, the server waits
    # for the building slot and shares its cells
    FIRST_SIGHT_ATTACH = "first_sight_attach"
    HEAD_EXCEEDS_CONTEXT = "head_exceeds_context"  # the head does not fit the pod's slot context
    # waited for a build on its own pod that an idle pod would beat: scheduled again without that pod
    # (never forwarded with this branch; counted in `first_sight{role="moved"}`)
    FIRST_SIGHT_MOVED = "first_sight_moved"



#: The branches of decisions made without the index.
DEGRADED_BRANCHES = frozenset({Branch.DEGRADED_HASH, Branch.DEGRADED_FALLBACK})


# ---- per-request data -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """One request as the scheduler sees it: no headers, no body, only what routing depends on."""

    request_id: str
    model: str
    prompt: PromptIdentity
    session_id: str | None = None


_VIEWS = itertools.count()  # `EndpointState.view`: unique within the process, never reused


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint plus its load, as discovery and the router's own in-flight bookkeeping know it.

    `busy_slots` are the slots this router has requests on; other replicas' requests are kept off by
    the slot leases, not by what /slots polling reports (fleet/state.py says why).
    """

    endpoint: Endpoint
    busy_slots: frozenset[int] = frozenset()
    queue_depth: int = 0  # requests waiting on the pod (deferred tasks)
    in_flight: int = 0
    healthy: bool = True
    # When each slot was last released by this router (a sequence number: larger is more recent; slots
    # never used are absent). Among slots that score alike, the one used longest ago is overwritten
    # first, so a conversation between two turns keeps its slot (candidates.py).
    slot_last_used: Mapping[int, int] = field(default_factory=dict, compare=False)
    # This router's requests pinned to each slot, running or deferred there (absent: none): a queued
    # request joins the shortest queue of the slots that hold its prefix alike.
    slot_requests: Mapping[int, int] = field(default_factory=dict, compare=False)
    # Computed once at construction: filters and scorers read it per request, often per candidate.
    idle_slots: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # A number no other view of this process has: what the scheduler keeps per view is found by it
    # (pod_rows.py; `id()` of a thousand views allocated a thousand ints per request).
    view: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        busy = self.busy_slots
        idle = tuple(s for s in range(self.endpoint.n_slots) if s not in busy) if busy else tuple(
            range(self.endpoint.n_slots))
        object.__setattr__(self, "idle_slots", idle)
        object.__setattr__(self, "view", next(_VIEWS))

    @property
    def uid(self) -> str:
        return self.endpoint.pod.uid

    @property
    def load(self) -> int:
        return self.in_flight + self.queue_depth

    def released_at(self, slot: int) -> int:
        """When this router last released `slot` (-1: never): the order slots that score alike are
        overwritten in, oldest first (candidates.py, the max-score picker)."""
        return self.slot_last_used.get(slot, -1)


class StateKey(Generic[T]):
    """A typed key of the CycleState; the type parameter ties writers and readers together for mypy."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """Per-request key-value store: producers write, scorers read. Lives for one schedule() call."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def write(self, key: StateKey[T], value: T) -> None:
        self._data[key.name] = value

    def read(self, key: StateKey[T], default: T) -> T:
        value: T = self._data.get(key.name, default)
        return value

    def has(self, key: StateKey[Any]) -> bool:
        return key.name in self._data


# Keys with one writer each. Consumers must cope with absence (the default passed to `read`).
LOOKUP: StateKey[Lookup] = StateKey("lookup")  # written by prefix-lookup
INDEX_AVAILABLE: StateKey[bool] = StateKey("index_available")  # written by prefix-lookup
RESTORE_ENABLED: StateKey[bool] = StateKey("restore_enabled")  # written by the scheduler from config


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (endpoint, slot) the request could be pinned to."""

    state: EndpointState
    slot: int
    # Built once: every scorer keys its answer by it, so a property would build it scorers x times.
    key: SlotRef = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", SlotRef(self.state.endpoint.pod.uid, self.slot))

    @property
    def endpoint(self) -> Endpoint:
        return self.state.endpoint


@dataclass(frozen=True, slots=True)
class ScoredCandidate:
    """A candidate with its weighted total and the raw (clamped) score of each scorer, by plugin name."""

    candidate: Candidate
    total: float
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """Where the request goes and what to do first.

    `branch` says why (`Branch`). `lease_holder` is None when no lease was taken (queued,
    or the lease store was down).
    """

    endpoint: Endpoint
    slot: int
    action: Action
    snapshot: SnapshotRef | None
    predicted_blocks: int
    branch: Branch
    lease_holder: str | None = None
    # A snapshot on another pod that would have given this pod more than what it uses now, had it been
    # here (`action.wanted_here`): the snapshot flow copies it here in the background for the next one.
    wanted: SnapshotRef | None = None
    # The index lookup the decision was made on (its live pods' part), for the steps after it (the
    # snapshot flow's first sight): one lookup per request. None when the index was not read.
    lookup: Lookup | None = field(default=None, compare=False, repr=False)

    @property
    def slot_ref(self) -> SlotRef:
        return SlotRef(self.endpoint.pod.uid, self.slot)


class NoEndpointError(Exception):
    """No endpoint can take the request (none healthy, none serving the model). The API maps it to 503."""

"""Contracts of the scheduling pipeline: request, per-endpoint state, cycle state, candidates, decision,
and the four plugin protocols.

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from llamafleet_core.types import Action, Endpoint, Lookup, SlotRef, SnapshotRef

T = TypeVar("T")

# `Decision.slot` for "let llama-server choose": a queued request that no slot holds a prefix for gains
# nothing from being pinned to one busy slot, and -1 is llama-server's own "any slot" value for id_slot.
ANY_SLOT = -1

PluginKind = Literal["producer", "filter", "scorer", "picker"]

# metrics_hook(point, plugin_type, plugin_name, seconds): the app wires Prometheus to it.
MetricsHook = Callable[[str, str, str, float], None]


# ---- collaborators (structural) --------------------------------------------------------------------


class PromptLike(Protocol):
    """What the scheduler needs of `llamafleet_core.prefix.identity.PromptIdentity`."""

    @property
    def model(self) -> str: ...

    @property
    def blocks(self) -> tuple[str, ...]: ...  # chained block hashes: block i's hash covers blocks 0..i

    @property
    def session_blocks(self) -> Sequence[str]: ...  # the blocks of the session prefix (tools + system)

    @property
    def block_chars(self) -> int: ...


class PrefixIndexLike(Protocol):
    """The read side of `llamafleet_core.index.base.PrefixIndex`; raises when the index is unavailable."""

    async def lookup(self, model: str, blocks: tuple[str, ...], /) -> Lookup: ...


class SlotLeasesLike(Protocol):
    """`llamafleet_core.index.base.SlotLeases`: a slot pinned by one router replica at a time."""

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float, /) -> bool: ...

    async def release(self, slot: SlotRef, holder: str, /) -> None: ...


# ---- per-request data -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedRequest:
    """One request as the scheduler sees it: no headers, no body, only what routing depends on."""

    request_id: str
    model: str
    prompt: PromptLike
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint plus its load, as discovery and the router's own in-flight bookkeeping know it.

    `busy_slots` merges the slots the router itself has requests on with what /slots polling reports,
    so a slot is only offered when neither source thinks it is processing.
    """

    endpoint: Endpoint
    busy_slots: frozenset[int] = frozenset()
    queue_depth: int = 0  # requests waiting on the pod (deferred tasks)
    in_flight: int = 0
    healthy: bool = True
    # Computed once at construction: filters and scorers read it per request, often per candidate.
    idle_slots: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        busy = self.busy_slots
        idle = tuple(s for s in range(self.endpoint.n_slots) if s not in busy) if busy else tuple(
            range(self.endpoint.n_slots))
        object.__setattr__(self, "idle_slots", idle)

    @property
    def uid(self) -> str:
        return self.endpoint.pod.uid

    @property
    def load(self) -> int:
        return self.in_flight + self.queue_depth


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

    `branch` is the metrics label explaining why (SGLang-style): slot_hit, pod_hit, restore, cold,
    session_affinity, degraded_hash, queued. `lease_holder` is None when no lease was taken (queued,
    or the lease store was down).
    """

    endpoint: Endpoint
    slot: int
    action: Action
    snapshot: SnapshotRef | None
    predicted_blocks: int
    branch: str
    lease_holder: str | None = None

    @property
    def slot_ref(self) -> SlotRef:
        return SlotRef(self.endpoint.pod.uid, self.slot)


class NoEndpointError(Exception):
    """No endpoint can take the request (none healthy, none serving the model). The API maps it to 503."""


# ---- plugin protocols ------------------------------------------------------------------------------


@runtime_checkable
class Producer(Protocol):
    """Fetches data once per request and writes it to the CycleState. The ONLY place with I/O."""

    type_name: ClassVar[str]
    name: str

    async def prepare(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> None: ...


@runtime_checkable
class Filter(Protocol):
    type_name: ClassVar[str]
    name: str

    def filter(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> list[EndpointState]: ...


@runtime_checkable
class Scorer(Protocol):
    """Pure: scores each candidate in [0, 1] (the scheduler clamps anyway); a missing key scores 0."""

    type_name: ClassVar[str]
    name: str

    def score(
        self, req: SchedRequest, state: CycleState, candidates: Sequence[Candidate]
    ) -> dict[SlotRef, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Ranks scored candidates best first, so the scheduler can fall back when a lease fails."""

    type_name: ClassVar[str]
    name: str

    def pick(
        self, req: SchedRequest, state: CycleState, scored: Sequence[ScoredCandidate]
    ) -> list[ScoredCandidate]: ...


@runtime_checkable
class PodScorer(Protocol):
    """Optional, for scorers whose score is the same for every slot of a pod (load, free slots, the
    degraded hash): the scheduler calls this once per request instead of `score`, and reads it per pod.
    Must agree with `score`, which stays the reference (and what tests check)."""

    def score_pods(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> Mapping[str, float]: ...  # pod uid -> score; a missing uid scores 0


@runtime_checkable
class GatedScorer(Protocol):
    """Optional, for scorers that know in advance that they score 0 everywhere for this request (no
    session id, the index is up for the degraded hash): the scheduler then skips `score` entirely."""

    def applies(self, req: SchedRequest, state: CycleState) -> bool: ...


@runtime_checkable
class SlotNominator(Protocol):
    """Optional, for scorers: slots this plugin may score above their pod's unnamed idle slots.

    The scheduler scores only named slots and one representative per pod (see the module docstring), so
    a scorer that prefers one particular slot for a reason the index does not know must name it here.
    Must be cheap and pure."""

    def nominate(self, req: SchedRequest, state: CycleState) -> Iterable[SlotRef]: ...


@runtime_checkable
class DecisionHook(Protocol):
    """Optional: plugins that learn from decisions (session affinity). Must be cheap and never raise."""

    def on_decision(self, req: SchedRequest, decision: Decision) -> None: ...


@dataclass(frozen=True, slots=True)
class PluginHandle:
    """What a plugin factory may be given besides its params: the I/O collaborators."""

    index: PrefixIndexLike | None = None


class PluginParams(BaseModel):
    """Base of every plugin's parameter model: unknown keys are config errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# factory(name, raw params, handle) -> plugin instance; validates its params with its own model.
PluginFactory = Callable[[str, Mapping[str, Any], PluginHandle], object]


class NoParamsPlugin:
    """Base of the plugins that take no parameters: their name, and a factory that still refuses any
    parameter given to them (a typo in the config is an error, not silently ignored)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any], handle: PluginHandle) -> Self:
        PluginParams.model_validate(params)
        return cls(name)


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """A registry entry: enough to validate a config without building anything."""

    type_name: str
    kind: PluginKind
    params: type[PluginParams]
    factory: PluginFactory
    produces: tuple[str, ...] = ()  # CycleState key names
    consumes: tuple[str, ...] = ()


def clamp01(value: float) -> float:
    """Clamp to [0, 1]; NaN becomes 0 so one broken scorer cannot poison a total."""
    if value != value:  # NaN
        return 0.0
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value

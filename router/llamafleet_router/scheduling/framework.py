"""Contracts of the scheduling pipeline's plugins: the four plugin protocols (producer, filter, scorer,
picker), the optional capabilities a scorer may add, and what the registry needs to build plugins from
a config.

The data these contracts speak of (request, endpoint state, cycle state, candidates, decision) lives in
`data.py`, which also explains why scoring happens at slot level; this module re-exports all of it, so
`llamafleet_router.scheduling.framework` stays the one import for plugin code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict

from llamafleet_core.types import SlotRef
from llamafleet_router.scheduling.data import (
    ANY_SLOT,
    DEGRADED_BRANCHES,
    INDEX_AVAILABLE,
    LOOKUP,
    NO_LOOKUP,
    RESTORE_ENABLED,
    Branch,
    Candidate,
    CycleState,
    Decision,
    EndpointState,
    NoEndpointError,
    PrefixIndexLike,
    SchedRequest,
    ScoredCandidate,
    SlotLeasesLike,
    StateKey,
)

__all__ = [
    "ANY_SLOT",
    "DEGRADED_BRANCHES",
    "INDEX_AVAILABLE",
    "LOOKUP",
    "NO_LOOKUP",
    "RESTORE_ENABLED",
    "Branch",
    "Candidate",
    "CycleState",
    "Decision",
    "DecisionHook",
    "EndpointState",
    "Filter",
    "GatedScorer",
    "MetricsHook",
    "NoEndpointError",
    "NoParamsPlugin",
    "Picker",
    "PluginFactory",
    "PluginHandle",
    "PluginKind",
    "PluginParams",
    "PluginSpec",
    "PodLocalScorer",
    "PodScorer",
    "PrefixIndexLike",
    "Producer",
    "SchedRequest",
    "ScoredCandidate",
    "Scorer",
    "SlotLeasesLike",
    "SlotNominator",
    "StateKey",
    "clamp01",
]

PluginKind = Literal["producer", "filter", "scorer", "picker"]

# metrics_hook(point, plugin_type, plugin_name, seconds): the app wires Prometheus to it.
MetricsHook = Callable[[str, str, str, float], None]


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
    """Pure: scores each candidate in [0, 1] (the scheduler clamps anyway); a missing key scores 0.

    A slot-level scorer (one that is not a `PodScorer`) may read of a slot only what the lookup says
    of it (its run, the exact head, the conversation), its pod's kind (`candidates.pod_kind`), the
    snapshots and the nominated slots, and, on a pod whose slots share what it holds (--slot-attach,
    --cache-prefix), what the pod's other slots hold: the scheduler scores only one slot of each group
    the lookup names, and under a picker of fixed order only the best pods of each group of slots that
    score alike (`pruning.py`)."""

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
class OrderedPicker(Protocol):
    """Optional, for pickers that rank by total (highest first) and break ties by pod uid before
    anything else. With such a picker the scheduler builds and scores only the slots it could place
    (`pruning.py`): of slots that every slot-level scorer scores alike, which rank by their pods'
    pod-level totals alone, the few best; a picker that breaks ties at random cannot say which of them
    it would take, and says False."""

    @property
    def orders_ties_by_pod(self) -> bool: ...


@runtime_checkable
class PodScorer(Protocol):
    """Optional, for scorers whose score is the same for every slot of a pod (load, free slots, the
    degraded hash): the scheduler calls this once per request instead of `score`, and reads it per pod.
    Must agree with `score`, which stays the reference (and what tests check)."""

    def score_pods(
        self, req: SchedRequest, state: CycleState, endpoints: Sequence[EndpointState]
    ) -> Mapping[str, float]: ...  # pod uid -> score; a missing uid scores 0


@runtime_checkable
class PodLocalScorer(Protocol):
    """Optional, for pod-level scorers whose score of a pod is a function of that pod's `EndpointState`
    alone: not of the request, the cycle state or the other pods (queue depth, free slots). The router
    keeps a pod's `EndpointState` until the pod changes (fleet/state.py), so the scheduler asks this
    once per state it has not seen, not once per pod per request (`pod_rows.py`; docs/design.md,
    "Gateway process"). Must agree with `score`."""

    def score_pod(self, endpoint: EndpointState) -> float: ...


@runtime_checkable
class GatedScorer(Protocol):
    """Optional, for scorers that know in advance that they score 0 everywhere for this request (no
    session id, the index is up for the degraded hash): the scheduler then skips `score` entirely."""

    def applies(self, req: SchedRequest, state: CycleState) -> bool: ...


@runtime_checkable
class SlotNominator(Protocol):
    """Optional, for scorers: slots this plugin may score above their pod's unnamed idle slots.

    The scheduler scores only named slots and one representative per pod (see `data.py`'s docstring), so
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

"""What the snapshot steps share while they prepare one request's slot, and the step contract.

The steps (flow.py runs them in order: ship, restore, first sight, prime) each read and change one
`Preparation`: the decision the request will be forwarded with, what was restored into the slot,
which snapshot failed to restore, what a first-sight build saved. A step that settles the request
(`settle`) ends the preparation: the later steps do not run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import UNKEYED, Endpoint, Lookup, SnapshotRef, TextHasher
from llamafleet_router.discovery.base import PodStatus
from llamafleet_router.scheduling.framework import Decision, SchedRequest
from llamafleet_router.snapshots.flights import Prompt
from llamafleet_router.snapshots.prime import Primed
from llamafleet_router.snapshots.restore import Restored


@dataclass(slots=True)
class Preparation:
    """One request's slot preparation, from the scheduler's decision to the one it is forwarded with."""

    req: SchedRequest
    decision: Decision
    pods: Sequence[PodStatus]
    agents: dict[str, str]  # the target pod's peers' agents, by pod uid (same namespace: peers.py)
    slot_context: int  # the target pod's per-slot context (`/props` n_ctx); 0 when unknown
    primed: Primed | None = None  # what the slot was primed with, taken from the primed slots
    restored: Restored | None = None  # what the restore step, or a wait, put into the slot
    failed: SnapshotRef | None = None  # the snapshot whose restore failed (never chosen again here)
    built: SnapshotRef | None = None  # the head a first-sight build saved in this request's slot
    may_move: bool = True  # a waiter may ask to be scheduled on another pod (not twice per request)
    settled: bool = field(default=False)

    @property
    def target(self) -> Endpoint:
        return self.decision.endpoint

    @property
    def lookup(self) -> Lookup | None:
        """The scheduler's index lookup for this request, when its decision carries one."""
        return self.decision.lookup

    def settle(self, decision: Decision) -> None:
        """Forward with `decision`; the later steps do not run."""
        self.decision = decision
        self.settled = True


class Step(Protocol):
    """One before-request step of the snapshot flow. Never raises but for cancellation: the flow logs
    anything else and forwards as decided."""

    async def run(self, prep: Preparation) -> None: ...


def slot_context(pods: Sequence[PodStatus], target: Endpoint) -> int:
    """The per-slot context the target pod reported (`/props` n_ctx); 0 when unknown."""
    pod = next((p for p in pods if p.endpoint.uid == target.uid), None)
    return pod.props.n_ctx if pod is not None and pod.props is not None else 0


def head_prompt(req: SchedRequest) -> Prompt | None:
    """The exact text and the head cut first sight builds, for a request with a rendered identity.

    The cut is the SHARED head (before the first user message), not the session prefix: once a
    conversation has history, its own prefix is sent by no other session (docs/design.md, "First
    sight")."""
    prompt = req.prompt
    if not isinstance(prompt, PromptIdentity):
        return None
    hasher = prompt.hasher if isinstance(prompt.hasher, TextHasher) else UNKEYED
    return Prompt(req.model, prompt.text, tuple(prompt.blocks), prompt.shared_chars, hasher)

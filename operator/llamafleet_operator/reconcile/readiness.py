"""Which snapshots each pod must hold before it is ready, declared to its agent.

Agents run with `--await-required`: a pod is unready until someone declared its required snapshots, and
then until it holds them all. The operator is that someone. The required set of a fleet is the snapshot
of every SharedPrefix of the fleet that has one (its status hash), is not being deleted, and is held by
at least one running pod of the fleet, computed from the cluster every time, so the fleet timer (which
also covers fleets without any SharedPrefix: the empty set makes their pods ready) and every SharedPrefix
reconcile declare the same thing.

Why "held by a running pod": a prefix that no pod could build (longer than a slot's context, no idle
slot at that moment, a pod restarting mid-warm) would otherwise gate every pod on a snapshot that
exists nowhere, and take the whole fleet out of rotation. Such a prefix fails in its own status and is
retried (prefix.py); the pods stay routable meanwhile, only without that prefix warm.

Why not a pod readiness gate: the agent already answers the readiness probe and knows what it holds;
a gate would need the operator to write every pod's status, and would still need the same set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from llamafleet_core import labels as L
from llamafleet_core.agent_client import AgentError
from llamafleet_core.warming import PrefixSource, snapshot_name
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import Context, Log


@dataclass(frozen=True)
class FleetPrefix:
    """A SharedPrefix of a fleet, as readiness and membership need it."""

    name: str
    snapshot: str | None
    warm_pods: frozenset[str]
    deleting: bool

    def warm_on(self, pod: str) -> bool:
        return pod in self.warm_pods

    def required_on(self, running: Collection[str]) -> bool:
        """Whether pods must hold it: it has a snapshot, is not going away, and one of `running` holds it
        (there is a peer to pull it from)."""
        return self.snapshot is not None and not self.deleting and any(p in self.warm_pods for p in running)


def snapshot_of(name: str, text_hash: str | None) -> str | None:
    """The snapshot name a SharedPrefix's status hash stands for (`snapshot_name` uses only the name)."""
    if not text_hash:
        return None
    try:
        return snapshot_name(PrefixSource(name=name, model=""), text_hash)
    except ValueError:
        return None


def as_fleet_prefix(body: dict[str, Any]) -> FleetPrefix:
    meta, status = body["metadata"], body.get("status") or {}
    warm = frozenset(p["name"] for p in status.get("pods") or [] if p.get("state") == "Warm")
    return FleetPrefix(meta["name"], snapshot_of(meta["name"], status.get("hash")), warm,
                       bool(meta.get("deletionTimestamp")))


async def fleet_prefixes(ctx: Context, namespace: str, fleet: str) -> list[FleetPrefix]:
    items = await ctx.kube.list(L.API_VERSION, "SharedPrefix", namespace)
    return [as_fleet_prefix(sp) for sp in items
            if ((sp.get("spec") or {}).get("fleetRef") or {}).get("name") == fleet]


def required_set(prefixes: list[FleetPrefix], running: Collection[str]) -> list[str]:
    """The snapshots every pod of `running` (pod names) must hold before it is ready."""
    return sorted({p.snapshot for p in prefixes if p.required_on(running) and p.snapshot})


async def declare_required(ctx: Context, pods: list[P.Pod], prefixes: list[FleetPrefix],
                           logger: Log) -> None:
    """Tell every running pod's agent the fleet's required set, where it differs (idempotent)."""
    names = required_set(prefixes, [P.name(p) for p in pods])

    async def one(pod: P.Pod) -> None:
        agent = ctx.agent_of(pod)
        try:
            current = await agent.required()
            if current.declared and sorted(current.required) == names:
                return
            await agent.set_required(names)
        except AgentError as exc:
            # Not up yet, or restarting: the next tick tries again.
            logger.debug(f"could not declare required snapshots on {P.name(pod)}: {exc.reason}")
            return
        logger.info(f"pod {P.name(pod)} requires {names or 'no snapshots'}")

    await asyncio.gather(*(one(p) for p in pods))

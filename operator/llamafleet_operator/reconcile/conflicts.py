"""A model name that two fleets serve: the `ModelConflict` condition of each fleet involved.

The gateway routes a model name to exactly one fleet, and refuses a name that several fleets report
(503 `model_conflict`) unless `model_fleets` (chart value `gateway.modelFleets`, given to the operator
too) says which serves it. The operator sees every fleet it manages, so it says so in each one's
status, naming the other fleets, before a client meets the 503. Level-based like the rest: every
reconcile recomputes it from the fleets that exist now, so renaming a model or adding the mapping
clears it on each fleet's next tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from llamafleet_core import labels as L
from llamafleet_operator.reconcile.context import Context
from llamafleet_operator.status import Cond, condition

TYPE = "ModelConflict"
_GLOB = frozenset("*?[")


def fleet_id(namespace: str, name: str) -> str:
    """A fleet as `model_fleets` and the gateway name it."""
    return f"{namespace}/{name}"


def claims(fleets: list[dict[str, Any]]) -> dict[str, str]:
    """{`namespace/name`: model name} of the fleets that serve one (those being deleted do not)."""
    out = {}
    for body in fleets:
        meta = body.get("metadata") or {}
        model = ((body.get("spec") or {}).get("model") or {}).get("name")
        if model and not meta.get("deletionTimestamp"):
            out[fleet_id(str(meta.get("namespace") or ""), str(meta["name"]))] = str(model)
    return out


def model_condition(fleet: str, model: str, served: Mapping[str, str], mapping: Mapping[str, str]) -> Cond:
    """The `ModelConflict` condition of `fleet` (`namespace/name`) serving `model` (pure)."""
    owner = mapping.get(model)
    if owner == fleet:
        return condition(TYPE, False, "Mapped", f"model_fleets maps {model} to this fleet")
    if owner is not None:
        # Not a conflict, but this fleet gets none of its model's requests: worth a line in its status.
        return condition(TYPE, False, "MappedToOtherFleet",
                         f"model_fleets maps {model} to {owner}: the gateway sends this fleet none of "
                         "its requests")
    others = sorted(f for f, m in served.items() if m == model and f != fleet)
    if not others:
        return condition(TYPE, False, "Unique", "")
    return condition(TYPE, True, "ModelServedByOtherFleets",
                     f"model {model} is also served by {', '.join(others)}: the gateway refuses it "
                     "(503 model_conflict) until gateway.modelFleets names the fleet that serves it")


async def managed_fleets(ctx: Context) -> list[dict[str, Any]]:
    """Every LlamaFleet this operator manages: all namespaces when cluster-wide, else its namespaces (a
    pattern with a glob lists cluster-wide and keeps the matching ones, as kopf needs that right too)."""
    patterns = ctx.settings.namespaces
    if not patterns:
        return await ctx.kube.list(L.API_VERSION, "LlamaFleet", None)
    plain = [p for p in patterns if not _GLOB & set(p)]
    globs = [p for p in patterns if _GLOB & set(p)]
    out: list[dict[str, Any]] = []
    for namespace in sorted(set(plain)):
        out.extend(await ctx.kube.list(L.API_VERSION, "LlamaFleet", namespace))
    if globs:
        seen = set(plain)
        out.extend(f for f in await ctx.kube.list(L.API_VERSION, "LlamaFleet", None)
                   if (ns := (f.get("metadata") or {}).get("namespace") or "") not in seen
                   and any(fnmatchcase(ns, g) for g in globs))
    return out


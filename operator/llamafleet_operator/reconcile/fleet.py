"""LlamaFleet: render every child, server-side apply each, read the pods back, write status and membership.

One function for create, update, resume and the timer: it never asks what changed, only what should be
(level-based), so an operator restarted at any point converges on the next call. Children carry an
ownerReference to the fleet, so deleting the fleet lets the garbage collector remove them; membership in
Redis is the only external state, removed by `forget_fleet` (an optional delete handler: a leftover
hash is harmless, it names pods that no longer exist and routers fence them by uid).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from llamafleet_core import labels as L
from llamafleet_core import membership, podspec
from llamafleet_core.crd.models import ImageFeatures, LlamaFleet
from llamafleet_operator.reconcile import features as F
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile import restores as R
from llamafleet_operator.reconcile import slot_context as SC
from llamafleet_operator.reconcile.admission import violations
from llamafleet_operator.reconcile.conflicts import TYPE as MODEL_CONFLICT
from llamafleet_operator.reconcile.conflicts import claims, fleet_id, managed_fleets, model_condition
from llamafleet_operator.reconcile.context import Context, Forbidden, InvalidSpec, Log, describe_validation
from llamafleet_operator.reconcile.readiness import declare_required, fleet_prefixes
from llamafleet_operator.reconcile.stuck import degraded_reason, stuck
from llamafleet_operator.reconcile.tokens import ensure_agent_token
from llamafleet_operator.render import Target, render_all
from llamafleet_operator.status import Cond, condition, merge, transitions

API = L.API_VERSION
# Conditions whose every change is also an event: what needs someone to act.
REPORTED = ("Degraded", MODEL_CONFLICT, SC.TYPE, R.TYPE)


def parse_fleet(body: Mapping[str, Any]) -> LlamaFleet:
    """The typed fleet, or `InvalidSpec` naming the offending field."""
    try:
        return LlamaFleet.model_validate({
            "metadata": {k: v for k, v in dict(body.get("metadata") or {}).items()
                         if k in ("name", "namespace", "uid", "generation", "labels", "annotations")},
            "spec": dict(body.get("spec") or {}),
        })
    except ValidationError as exc:
        raise InvalidSpec(describe_validation(exc)) from exc


def fleet_status(fleet: LlamaFleet, pods: list[P.Pod], previous: Mapping[str, Any] | None,
                 features: ImageFeatures | None = None, model_conflict: Cond | None = None,
                 slot_context: int | None = None, restores: tuple[str, str] | None = None) -> dict[str, Any]:
    """Status from the pods that exist now, what the image is known to accept, whether another fleet
    serves the same model (`model_conflict`, conflicts.py) and the context the pods' slots really have
    (`slot_context`, slot_context.py) and whether they reuse restored snapshots (`restores`, (state,
    reason), restores.py); None keeps the last record of either (pure)."""
    spec, meta = fleet.spec, fleet.metadata
    support = F.support(features)
    live = [p for p in pods if not P.deleting(p)]
    n_ready = sum(P.ready(p) for p in live)
    failing = [s for s in (stuck(p) for p in live) if s]
    starting = [p for p in live if not P.ready(p) and stuck(p) is None]
    all_ready = n_ready >= spec.replicas and len(live) == spec.replicas
    if all_ready:
        ready = condition("Ready", True, "AllReplicasReady", f"{n_ready} of {spec.replicas} pods ready")
    else:
        ready = condition("Ready", False, "ReplicasNotReady", f"{n_ready} of {spec.replicas} pods ready")
    if len(live) < spec.replicas:
        progressing = condition("Progressing", True, "ScalingUp",
                                f"{len(live)} of {spec.replicas} pods exist")
    elif len(live) > spec.replicas:
        progressing = condition("Progressing", True, "ScalingDown", f"{len(live)} pods for {spec.replicas}")
    elif not all_ready and failing and not starting:
        # Every pod that is not ready is stuck: waiting changes nothing (Degraded says why).
        progressing = condition("Progressing", False, "PodsStuck",
                                f"{len(failing)} of {len(live)} pods cannot start")
    elif not all_ready:
        progressing = condition("Progressing", True, "PodsStarting", "waiting for pods to turn ready")
    else:
        progressing = condition("Progressing", False, "Stable", "")
    degraded = (condition("Degraded", True, degraded_reason(failing), "; ".join(s.message for s in failing))
                if failing else condition("Degraded", False, "AsExpected", ""))
    phase = "Degraded" if failing else "Ready" if all_ready else "Pending" if not live else "Progressing"
    slot_context = slot_context if slot_context is not None else (previous or {}).get("slotContext")
    capped = SC.capped_condition(spec, slot_context)
    restores_off = R.restores_condition(*restores) if restores is not None else None
    state = restores[0] if restores is not None else (previous or {}).get("restores")
    conditions = [ready, progressing, degraded] + [c for c in (model_conflict, capped, restores_off)
                                                   if c is not None]
    return {
        "replicas": spec.replicas,
        "readyReplicas": n_ready,
        "ready": f"{n_ready}/{spec.replicas}",
        "slots": n_ready * spec.slots,
        "selector": ",".join(f"{k}={v}" for k, v in L.fleet_labels(meta.name).items()),
        "attach": podspec.attach_enabled(spec, supported=support["attach_supported"]),
        "cachePrefix": podspec.cache_prefix_enabled(spec, supported=support["cache_prefix_supported"]),
        "slotContext": slot_context,
        "restores": state,
        # None removes a record of another image (a merge patch deletes null fields).
        "imageFeatures": features.to_k8s() if features is not None else None,
        "phase": phase,
        "observedGeneration": meta.generation,
        "conditions": merge((previous or {}).get("conditions"), conditions, generation=meta.generation),
    }


def invalid_status(message: str, generation: int | None,
                   previous: Mapping[str, Any] | None, reason: str = "InvalidSpec") -> dict[str, Any]:
    conds = [condition("Ready", False, reason, message),
             condition("Degraded", True, reason, message)]
    return {"phase": "Failed", "observedGeneration": generation,
            "conditions": merge((previous or {}).get("conditions"), conds, generation=generation)}


async def reconcile_fleet(ctx: Context, body: Mapping[str, Any],
                          logger: Log) -> dict[str, Any]:
    """Make the children match the spec; write and return the status. `InvalidSpec` on a bad spec."""
    meta = dict(body.get("metadata") or {})
    namespace, name = meta["namespace"], meta["name"]
    # Every managed fleet, read now: the model names they serve (conflicts.py), and this fleet's stored
    # status, not the body's: a handler that waited for another reconcile of this fleet holds a body
    # from before that one wrote (handlers/fleet.py), and conditions and events compare against what
    # was written last.
    fleets = await managed_fleets(ctx)
    stored = next((f for f in fleets if (f.get("metadata") or {}).get("namespace") == namespace
                   and (f.get("metadata") or {}).get("name") == name), body)
    previous = dict(stored.get("status") or {})
    try:
        fleet = parse_fleet(body)
    except InvalidSpec as exc:
        await ctx.kube.patch_status(API, "LlamaFleet", namespace, name,
                                    invalid_status(str(exc), meta.get("generation"), previous))
        raise
    problems = violations(fleet.spec, ctx.settings.admission_policy())
    if problems:
        # Nothing is applied: the operator would create these pods with its own rights. Children of an
        # earlier, admitted spec stay as they are until the spec is fixed.
        message = "; ".join(problems)
        await ctx.kube.patch_status(API, "LlamaFleet", namespace, name,
                                    invalid_status(message, meta.get("generation"), previous, "Forbidden"))
        raise Forbidden(message)
    await ensure_agent_token(ctx, namespace, logger)
    features = F.recorded(fleet.spec, previous.get("imageFeatures"))
    await _apply_children(ctx, fleet, namespace, features, logger)

    pods = await ctx.kube.list("v1", "Pod", namespace, L.fleet_labels(name))
    if podspec.detects_features(fleet.spec) and (
            features is None or not features.known or F.model_unknown(fleet.spec, features)):
        found = await F.detect(ctx, fleet.spec, pods, logger)
        if found is not None and not F.same(found, features):
            logger.info(f"image {found.image}: {_describe(found)} (asked the agent of {found.pod})")
            if F.support(found) != F.support(features):
                await _apply_children(ctx, fleet, namespace, found, logger)
            features = found
    served = claims(fleets)
    conflict = model_condition(fleet_id(namespace, name), fleet.spec.model.name, served,
                               ctx.settings.model_owners())
    answers = await SC.ask(ctx, pods, logger)
    status = fleet_status(fleet, pods, previous, features, conflict, SC.smallest(answers), R.probed(answers))
    if _changed(previous, status):
        await ctx.kube.patch_status(API, "LlamaFleet", namespace, name, status)
        logger.info(f"status: {status['ready']} ready, phase {status['phase']}")
        # One event per change of what is wrong, not one per tick.
        for bad, line in transitions(previous.get("conditions"), status["conditions"], REPORTED):
            (logger.warning if bad else logger.info)(line)

    prefixes = await fleet_prefixes(ctx, namespace, name)
    await declare_required(ctx, [p for p in pods if P.running(p)], prefixes, logger)
    if ctx.redis is not None:
        warm = {P.name(p): tuple(sorted(sp.name for sp in prefixes if sp.warm_on(P.name(p)))) for p in pods}
        members = [P.member(p, model=fleet.spec.model.name, slots=fleet.spec.slots, warm=warm[P.name(p)])
                   for p in pods if P.running(p)]
        if await membership.write_members(ctx.redis, namespace, name, members,
                                          prefix=ctx.settings.index_prefix, signing_key=ctx.membership_key):
            logger.info(f"membership: {sum(m.ready for m in members)} of {len(members)} pods routable")
    return status


async def _apply_children(ctx: Context, fleet: LlamaFleet, namespace: str, features: ImageFeatures | None,
                          logger: Log) -> None:
    target = Target.of(
        fleet, namespace=namespace, agent_token_secret=ctx.settings.agent_token_secret,
        gateway_namespace=ctx.settings.gateway_namespace, operator_namespace=ctx.settings.operator_namespace,
        agent_peer_networks=tuple(ctx.settings.agent_peer_networks), agent_image=ctx.settings.agent_image,
        metrics_peers=tuple(ctx.settings.metrics_peers), metrics_server=ctx.settings.metrics_server,
        **F.support(features),
    )
    for manifest in render_all(fleet, target):
        await _apply(ctx, manifest, logger)


def _describe(record: ImageFeatures) -> str:
    if not record.known:
        return f"features unknown ({record.message})"
    flags = (("--slot-attach", record.slot_attach), ("--cache-prefix", record.cache_prefix),
             ("--slot-save-checkpoints", record.slot_checkpoints))
    on = [flag for flag, ok in flags if ok]
    said = f"accepts {', '.join(on)}" if on else "accepts no prefix-sharing flag"
    if record.sliding_window and record.slot_attach:
        said += (f"; the model has a sliding window ({record.sliding_window} tokens), which llama-server "
                 "attaches no slot of: per-slot KV streams")
    return said


async def forget_fleet(ctx: Context, namespace: str, name: str) -> None:
    if ctx.redis is not None:
        await membership.remove_fleet(ctx.redis, namespace, name, prefix=ctx.settings.index_prefix)


async def _apply(ctx: Context, manifest: dict[str, Any], logger: Log) -> None:
    meta = manifest["metadata"]
    before = await ctx.kube.get(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
    after = await ctx.kube.apply(manifest)
    what = f"{manifest['kind']} {meta['name']}"
    if before is None:
        logger.info(f"created {what}")
    elif before["metadata"].get("resourceVersion") != after["metadata"].get("resourceVersion"):
        logger.info(f"updated {what}")


def _changed(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    return any(previous.get(k) != v for k, v in status.items())

"""SharedPrefix: warm it on every running pod of its fleet, keep it warm, re-warm on change, remove it.

Level-based like the fleet: every call looks at the pods that run now. The first call (and the first after
a spec change or an operator restart) runs the whole `warm_shared_prefix`, which computes nothing for pods
that already hold the snapshot; later timer ticks only `warm_pod` the pods that do not hold it yet (new or
restarted ones). A changed prefix is a new snapshot (its name carries the text hash): the new one is
shipped first and declared required, and only then is the old one removed, so no pod is ever without a
warm prefix. Text referenced from a ConfigMap (`spec.textFrom`, prefix_text.py) is read on every call,
so an edited ConfigMap is such a change too. Deletion goes through a finalizer, because snapshots on
pods and index entries in Redis are state the garbage collector cannot see.

A prefix that no pod could build (longer than a slot's context, every slot busy, a pod restarting) fails
in its own status (Degraded `SeedFailed`, or Failed with the spec problem's reason such as
`PrefixTooLong`), is never required of any pod (readiness.py), and is built again with backoff
(retry.py), also when every pod that held it has gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from llamafleet_core import labels as L
from llamafleet_core.crd.models import SharedPrefix
from llamafleet_core.warming import (
    PodWarmState,
    PrefixSource,
    WarmError,
    WarmPod,
    WarmResult,
    remove_shared_prefix,
    warm_pod,
    warm_shared_prefix,
)
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import Context, InvalidSpec, Log, describe_validation
from llamafleet_operator.reconcile.prefix_status import error_status, prefix_status
from llamafleet_operator.reconcile.prefix_text import (
    Revision,
    TextNotFound,
    prefix_source,
    referenced_text,
    revision,
)
from llamafleet_operator.reconcile.readiness import declare_required, fleet_prefixes, snapshot_of
from llamafleet_operator.reconcile.retry import backoff_for

API = L.API_VERSION


def parse_prefix(body: Mapping[str, Any]) -> SharedPrefix:
    try:
        return SharedPrefix.model_validate({"spec": dict(body.get("spec") or {})})
    except ValidationError as exc:
        raise InvalidSpec(describe_validation(exc)) from exc


async def _write(ctx: Context, body: Mapping[str, Any], status: dict[str, Any]) -> None:
    previous = dict(body.get("status") or {})
    if any(previous.get(k) != v for k, v in status.items()):
        meta = body["metadata"]
        await ctx.kube.patch_status(API, "SharedPrefix", meta["namespace"], meta["name"], status)


async def _fleet_pods(ctx: Context, namespace: str, fleet: str) -> list[P.Pod]:
    pods = await ctx.kube.list("v1", "Pod", namespace, L.fleet_labels(fleet))
    return sorted((p for p in pods if P.running(p)), key=P.name)


async def reconcile_prefix(ctx: Context, body: Mapping[str, Any], logger: Log) -> None:
    """Warm where missing, write status, declare readiness. `InvalidSpec` on a bad spec."""
    meta = dict(body["metadata"])
    namespace, name, uid, generation = meta["namespace"], meta["name"], meta["uid"], meta.get("generation")
    previous = dict(body.get("status") or {})
    try:
        sp = parse_prefix(body)
    except InvalidSpec as exc:
        await _write(ctx, body, error_status("InvalidSpec", str(exc), generation, previous, phase="Failed"))
        raise
    try:
        text = await referenced_text(ctx, namespace, sp.spec)
    except TextNotFound as exc:
        await _write(ctx, body, error_status(exc.reason, str(exc), generation, previous, phase="Pending"))
        return
    rev = revision(generation, text)
    fleet_name = sp.spec.fleet_ref.name
    fleet = await ctx.kube.get(API, "LlamaFleet", namespace, fleet_name)
    if fleet is None:
        await _write(ctx, body, error_status(
            "FleetNotFound", f"spec.fleetRef.name: no LlamaFleet {fleet_name!r} in {namespace}", generation,
            previous, phase="Pending"))
        return
    fleet_spec = dict(fleet.get("spec") or {})
    model = str((fleet_spec.get("model") or {}).get("name") or "")
    pods = await _fleet_pods(ctx, namespace, fleet_name)
    if not pods:
        await _write(ctx, body, error_status("NoRunningPods", f"fleet {fleet_name} has no running pods",
                                             generation, previous, phase="Pending", degraded=False))
        return
    source = prefix_source(name, sp.spec, model, text)
    targets = [P.warm_pod(p, ctx.pod_api_key) for p in pods]
    retry = backoff_for(ctx.seed_retries, uid, rev, initial_s=ctx.settings.prefix_retry_initial_s,
                        max_s=ctx.settings.prefix_retry_max_s)
    now = ctx.clock()
    if _must_seed(ctx, uid, rev, targets) and not retry.due(now):
        return  # the last attempt's status says why it failed and when the next one runs
    context = int(fleet_spec.get("contextPerSlot") or 0) or None
    last_built = ctx.warm_results.get(uid)
    try:
        result = await _warm(ctx, uid, rev, source, targets, sp.spec.pin, logger, namespace=namespace,
                             max_tokens=context)
    except WarmError as exc:
        note = retry.note(retry.failed(now))
        logger.error(f"cannot warm: {exc}; {note}")
        await _write(ctx, body, error_status(exc.reason, f"{exc}; {note}", generation, previous,
                                             phase="Failed"))
        return
    if result.snapshot:
        retry.succeeded()
        status = prefix_status(result, generation, previous)
    else:
        note = retry.note(retry.failed(now))
        logger.warning(f"no pod could build the prefix; {note}")
        status = prefix_status(result, generation, previous, note=note)
    await _write(ctx, body, status)

    # The body's status may predate the last write (a timer tick that waited for a handler to finish),
    # so the snapshot this operator built last is an old one as well.
    olds = {snapshot_of(name, previous.get("hash")), last_built[1].snapshot if last_built else None}
    prefixes = await fleet_prefixes(ctx, namespace, fleet_name)
    await declare_required(ctx, pods, prefixes, logger)
    for old in sorted(o for o in olds if o and result.snapshot and o != result.snapshot):
        # The new snapshot is shipped and required; the old one can go.
        await remove_shared_prefix(old, targets, http=ctx.http, agent_token=ctx.agent_token_for(namespace),
                                   index=ctx.index, model=model)
        logger.info(f"removed the previous snapshot {old}")


def _must_seed(ctx: Context, uid: str, rev: Revision, targets: list[WarmPod]) -> bool:
    """Whether the next warm builds the prefix from its text (not only pulls from a warm pod): nothing
    known for this revision, or no pod of `targets` holds it (the ones that did are gone)."""
    cached = ctx.warm_results.get(uid)
    if cached is None or cached[0] != rev or not cached[1].snapshot:
        return True
    names = {t.name for t in targets}
    return not any(s.state == "warm" and s.pod in names for s in cached[1].pods)


async def _warm(ctx: Context, uid: str, rev: Revision, source: PrefixSource,
                targets: list[WarmPod], pin: bool, logger: Log, *, namespace: str,
                max_tokens: int | None) -> WarmResult:
    names = {t.name for t in targets}
    cached = ctx.warm_results.get(uid)
    if cached is None or _must_seed(ctx, uid, rev, targets):
        def progress(state: PodWarmState) -> None:
            if state.state != "pending" or state.message != "waiting":
                logger.info(f"{state.pod}: {state.state}: {state.message}")

        result = await warm_shared_prefix(source, targets, http=ctx.http,
                                          agent_token=ctx.agent_token_for(namespace), index=ctx.index,
                                          pin=pin, progress=progress, max_tokens=max_tokens,
                                          prefix_key=ctx.prefix_key)
    else:
        result = cached[1]
        warm = {s.pod for s in result.pods if s.state == "warm"}
        states = {s.pod: s for s in result.pods if s.pod in names}
        peers = [t for t in targets if t.name in warm]
        for target in targets:
            if target.name in warm:
                continue
            state = await warm_pod(result, source, target, peers=peers, http=ctx.http,
                                   agent_token=ctx.agent_token_for(namespace), index=ctx.index, pin=pin)
            if states.get(target.name) is None or states[target.name].state != state.state:
                logger.info(f"{target.name}: {state.state}: {state.message}")
            states[target.name] = state
            if state.state == "warm":
                peers.append(target)
        result.pods = [states[t.name] for t in targets if t.name in states]
    result.pods = [s for s in result.pods if s.pod in names]
    ctx.warm_results[uid] = (rev, result)
    return result


async def remove_prefix(ctx: Context, body: Mapping[str, Any], logger: Log) -> None:
    """On delete: stop requiring the snapshot, then delete it on every pod and forget it in the index.

    Raises `WarmError` when a pod could not be cleaned, so the finalizer stays and kopf retries.
    """
    meta = dict(body["metadata"])
    namespace, name = meta["namespace"], meta["name"]
    ctx.warm_results.pop(str(meta.get("uid")), None)
    snapshot = snapshot_of(name, (body.get("status") or {}).get("hash"))
    fleet_name = ((body.get("spec") or {}).get("fleetRef") or {}).get("name")
    if not snapshot or not fleet_name:
        return
    pods = await _fleet_pods(ctx, namespace, fleet_name)
    fleet = await ctx.kube.get(API, "LlamaFleet", namespace, fleet_name)
    model = str((((fleet or {}).get("spec") or {}).get("model") or {}).get("name") or "") or None
    # This prefix is being deleted, so the required set computed now leaves it out.
    await declare_required(ctx, pods, await fleet_prefixes(ctx, namespace, fleet_name), logger)
    await remove_shared_prefix(snapshot, [P.warm_pod(p, ctx.pod_api_key) for p in pods], http=ctx.http,
                               agent_token=ctx.agent_token_for(namespace), index=ctx.index, model=model)
    logger.info(f"removed snapshot {snapshot} from {len(pods)} pods")

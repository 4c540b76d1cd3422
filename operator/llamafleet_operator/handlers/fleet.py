"""LlamaFleet handlers: create, update, resume and a timer all run the same level-based reconcile."""

from __future__ import annotations

from typing import Any

import kopf

from llamafleet_core.labels import GROUP, VERSION
from llamafleet_operator.handlers.events import EventLogger
from llamafleet_operator.kube import KubeError
from llamafleet_operator.reconcile.context import Context, InvalidSpec
from llamafleet_operator.reconcile.fleet import forget_fleet, reconcile_fleet
from llamafleet_operator.settings import OperatorSettings

PLURAL = "llamafleets"


async def _locked(memo: kopf.Memo, uid: str, body: kopf.Body, logger: kopf.Logger) -> None:
    ctx: Context = memo.ctx
    # The timer and the change handlers of one fleet may overlap: one reconcile at a time, so that each
    # starts from the status the one before wrote (and posts an event for a change only once).
    async with ctx.lock(uid):
        await reconcile_fleet(ctx, body, EventLogger(body, logger, "Reconcile"))


async def reconcile_fn(uid: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    try:
        await _locked(memo, uid, body, logger)
    except InvalidSpec as exc:
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc


async def timer_fn(uid: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    try:
        await _locked(memo, uid, body, logger)
    except InvalidSpec:
        return  # the status already says why; the next spec change runs the update handler


async def forget_fn(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await forget_fleet(memo.ctx, body.metadata["namespace"], body.metadata["name"])


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    on: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}
    kopf.on.create(**on, id="fleet-create")(reconcile_fn)
    kopf.on.update(**on, id="fleet-update")(reconcile_fn)
    kopf.on.resume(**on, id="fleet-resume")(reconcile_fn)
    kopf.timer(**on, id="fleet-timer", interval=settings.reconcile_interval_s,
               initial_delay=settings.reconcile_interval_s)(timer_fn)
    # Children go with the ownerReferences; only the membership hash is ours to remove, and a leftover
    # one is harmless, so no finalizer for it.
    kopf.on.delete(**on, id="fleet-forget", optional=True)(forget_fn)

"""SharedPrefix handlers: warm on create/update/resume, keep warm on a timer, clean up behind a finalizer."""

from __future__ import annotations

from typing import Any

import kopf

from llamafleet_core.labels import GROUP, VERSION
from llamafleet_core.warming import WarmError
from llamafleet_operator.handlers.events import EventLogger
from llamafleet_operator.kube import KubeError
from llamafleet_operator.reconcile.context import Context, InvalidSpec
from llamafleet_operator.reconcile.prefix import reconcile_prefix, remove_prefix
from llamafleet_operator.settings import OperatorSettings

PLURAL = "sharedprefixes"


async def _locked(memo: kopf.Memo, uid: str, body: kopf.Body, logger: kopf.Logger,
                  stopped: kopf.DaemonStopped | None = None) -> None:
    ctx: Context = memo.ctx
    # The timer and the change handlers of one object may overlap; one warm at a time per prefix.
    async with ctx.lock(uid):
        if stopped:
            return  # the object is being deleted (its cleanup held the lock): warming again would undo it
        await reconcile_prefix(ctx, body, EventLogger(body, logger, "Warm"))


async def reconcile_fn(uid: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    try:
        await _locked(memo, uid, body, logger)
    except InvalidSpec as exc:
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except KubeError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=5) from exc


async def timer_fn(uid: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any) -> None:
    # kopf passes timers `stopped` (set once the object is being deleted); its TimerFn type omits it.
    stopped: kopf.DaemonStopped | None = kwargs.get("stopped")
    try:
        await _locked(memo, uid, body, logger, stopped)
    except InvalidSpec:
        return


async def remove_fn(uid: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    ctx: Context = memo.ctx
    try:
        async with ctx.lock(uid):
            await remove_prefix(ctx, body, EventLogger(body, logger, "Cleanup"))
    except (WarmError, KubeError) as exc:
        raise kopf.TemporaryError(f"cleanup incomplete: {exc}", delay=5) from exc


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    on: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}
    kopf.on.create(**on, id="prefix-create")(reconcile_fn)
    kopf.on.update(**on, id="prefix-update")(reconcile_fn)
    kopf.on.resume(**on, id="prefix-resume")(reconcile_fn)
    kopf.timer(**on, id="prefix-timer", interval=settings.prefix_interval_s,
               initial_delay=settings.prefix_interval_s)(timer_fn)
    # Not optional: kopf adds the finalizer, so snapshots and index entries are removed before it goes.
    kopf.on.delete(**on, id="prefix-remove")(remove_fn)

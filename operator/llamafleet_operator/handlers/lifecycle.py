"""Start-up and clean-up: kopf's own settings, and the collaborators every reconcile gets (in memo)."""

from __future__ import annotations

from typing import Any

import kopf

from llamafleet_core import http_pool
from llamafleet_core.index.redis_conn import connect
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_operator.handlers.diffbase import DigestedDiffBaseStorage
from llamafleet_operator.kube import Kube, default_kubeconfig, load_configuration
from llamafleet_operator.reconcile.context import Context
from llamafleet_operator.settings import OperatorSettings

PREFIX = "llamafleet.io"


async def startup_fn(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    ours: OperatorSettings = memo.settings
    ours.admission_policy()  # a bad image pattern stops the start, not every fleet's reconcile later
    # Progress and the last handled spec go to annotations: the CRDs' structural status schema would
    # prune kopf's default `status.kopf`. A finalizer of our own name guards SharedPrefix cleanup.
    # The last handled spec holds a prefix's content as digests: the text itself would not fit (diffbase.py).
    settings.persistence.finalizer = f"{PREFIX}/cleanup"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{PREFIX}")
    settings.persistence.diffbase_storage = DigestedDiffBaseStorage(
        prefix=f"kopf.{PREFIX}", key="last-handled-configuration")
    settings.posting.level = 20  # INFO and above become Kubernetes events
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    # A deletion waits for the object's timers to exit; check for that often, or the finalizer (and
    # `kubectl delete`) waits a whole minute for a timer that was mid-reconcile.
    settings.background.cancellation_polling = 1.0
    redis = connect(ours.redis_url, timeout_s=2.0) if ours.redis_url else None
    # The index owns its own (lean) client, closed with it; membership writes go through redis-py.
    index = None if not ours.redis_url else RedisPrefixIndex.from_url(
        ours.redis_url, prefix=ours.index_prefix, timeout_s=2.0, op_timeout_s=2.0)
    memo.ctx = Context(
        kube=await Kube.connect(default_kubeconfig(ours.kubeconfig)),
        http=http_pool.async_client(timeout=ours.http_timeout_s),
        settings=ours,
        agent_token=ours.resolved_agent_token(),
        pod_api_key=ours.resolved_pod_api_key(),
        prefix_key=ours.resolved_prefix_key(),
        membership_key=ours.resolved_membership_key(),
        redis=redis,
        index=index,
    )
    logger.info(f"operator started (redis: {'on' if redis is not None else 'off'})")


async def login_fn(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: the same credentials as the operator's client (see `kube.py`)."""
    kubeconfig = default_kubeconfig(memo.settings.kubeconfig)
    if kubeconfig is None:
        return kopf.login_with_service_account(**kwargs)
    cfg = await load_configuration(kubeconfig)
    token = (cfg.api_key or {}).get("authorization", "").removeprefix("Bearer ").strip()
    return kopf.ConnectionInfo(
        server=str(cfg.host), insecure=not cfg.verify_ssl, ca_path=cfg.ssl_ca_cert or None,
        token=token or None, certificate_path=cfg.cert_file or None, private_key_path=cfg.key_file or None,
    )


async def cleanup_fn(memo: kopf.Memo, **_: Any) -> None:
    ctx: Context | None = getattr(memo, "ctx", None)
    if ctx is not None:
        await ctx.close()


def register(registry: kopf.OperatorRegistry) -> None:
    kopf.on.login(id="login", registry=registry)(login_fn)
    kopf.on.startup(id="startup", registry=registry)(startup_fn)
    kopf.on.cleanup(id="cleanup", registry=registry)(cleanup_fn)

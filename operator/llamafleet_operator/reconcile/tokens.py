"""Make sure a fleet's namespace holds its agent-token Secret, with the value derived for it.

Read by name and written only when missing or different, so the operator needs `get` and `patch` on that
one Secret name (RBAC `resourceNames`) plus `create`, and never lists or reads any other Secret.
"""

from __future__ import annotations

from llamafleet_operator.reconcile.context import Context, Log
from llamafleet_operator.render.secret import render_agent_token_secret


async def ensure_agent_token(ctx: Context, namespace: str, logger: Log) -> None:
    name = ctx.settings.agent_token_secret
    token = ctx.agent_token_for(namespace)
    if name is None or not token:
        return  # no Secret to mount (tests, or agents given their token some other way)
    manifest = render_agent_token_secret(name, namespace, token)
    current = await ctx.kube.get("v1", "Secret", namespace, name)
    if current is not None and (current.get("data") or {}).get("token") == manifest["data"]["token"]:
        return
    await ctx.kube.apply(manifest)
    logger.info(f"{'created' if current is None else 'updated'} the agent token Secret {name} of {namespace}")

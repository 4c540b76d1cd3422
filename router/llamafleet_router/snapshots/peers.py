"""Which peer agents a pod's agent may be told to pull from.

A pull makes the target pod's agent present ITS token to the peer (`llamafleet_agent.pull`). With
per-namespace agent tokens (fleets from the membership, `llamafleet_core.agent_tokens`), a peer in
another namespace is another tenant's pod: it must never be named as a source, or that pod would
receive this namespace's token (and could serve it KV of its choosing). So the gateway offers as
sources only pods whose agent the membership places in the target's own namespace; a pod the
membership does not place (or ignored: `discovery/addresses.py`) is never a source. Static pods
(one token for all, `llamafleet up`) are all peers of each other.

Pure: the caller passes discovery's pods and the token book.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamafleet_core.agent_tokens import AgentTokens
from llamafleet_core.types import Endpoint
from llamafleet_router.discovery.base import PodStatus


def peer_agents(pods: Sequence[PodStatus], target: Endpoint, tokens: AgentTokens | None) -> dict[str, str]:
    """Pod uid -> agent URL of every pod `target`'s agent may pull from."""
    scoped = tokens is not None and tokens.per_namespace
    home = tokens.namespace_of(target.agent_url) if scoped and tokens and target.agent_url else None
    out: dict[str, str] = {}
    for pod in pods:
        url = pod.endpoint.agent_url
        if not url:
            continue
        if scoped and (home is None or tokens is None or tokens.namespace_of(url) != home):
            continue
        out[pod.endpoint.uid] = url
    return out

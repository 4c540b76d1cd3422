"""Snapshot-agent tokens per namespace, derived from one master token that only the gateway and the
operator hold.

Why: the agent token lets its holder pull, restore, save and delete snapshots on a pod. Pods mount it
from a Secret of their own namespace, and whoever may create a LlamaFleet there chooses what runs in
those pods. With one token everywhere, one fleet author held the credential of every agent of the
installation; with a token per namespace, they hold only their own namespace's.

    token(namespace) = hex(HMAC-SHA256(master, "llamafleet agent token\\0" + namespace))

The operator writes each namespace's token into that namespace's Secret and presents it to agents there;
the gateway computes the same value for the pods the membership places in that namespace, and presents
no token at all (an empty one) to an agent the membership does not place (never the master). Agents
of one namespace pull from peers of the same fleet, so they need nothing but their own token. Local
fleets (`llamafleet up`, static discovery) have no namespaces and use the configured token as it is.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

_CONTEXT = b"llamafleet agent token\0"


def namespace_token(master: str, namespace: str) -> str:
    """The token agents in `namespace` accept (pure, deterministic, 64 hex characters)."""
    if not master:
        raise ValueError("no master agent token to derive from")
    if not namespace:
        raise ValueError("an agent token is derived for a namespace; none given")
    return hmac.new(master.encode(), _CONTEXT + namespace.encode(), hashlib.sha256).hexdigest()


class AgentTokens:
    """Which token to present to which agent (by agent URL).

    `per_namespace` off: the master itself, for every agent (local fleets). On: the namespace's derived
    token for agents the membership placed (`place`), and "" for any other URL.
    """

    def __init__(self, master: str, *, per_namespace: bool = False) -> None:
        self._master = master
        self.per_namespace = per_namespace
        self._namespaces: dict[str, str] = {}
        self._derived: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"AgentTokens(per_namespace={self.per_namespace}, agents={len(self._namespaces)})"

    def place(self, namespaces_by_agent_url: Mapping[str, str]) -> None:
        """Replace the whole map of agent URL -> namespace (what the membership says now)."""
        self._namespaces = dict(namespaces_by_agent_url)

    def namespace_of(self, agent_url: str) -> str | None:
        return self._namespaces.get(agent_url.rstrip("/"))

    def for_agent(self, agent_url: str) -> str:
        if not self.per_namespace:
            return self._master
        namespace = self.namespace_of(agent_url)
        if namespace is None:
            return ""
        token = self._derived.get(namespace)
        if token is None:
            token = self._derived[namespace] = namespace_token(self._master, namespace)
        return token

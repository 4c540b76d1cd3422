"""The agent-token Secret of one namespace (pure): what the pods of every fleet there mount.

Not a child of any fleet (no ownerReference): every fleet of the namespace mounts the same Secret, and a
fleet's deletion must not take it from the others. The value is derived from the master token
(`llamafleet_core.agent_tokens`), so the operator can write it again at any time and never needs to read
a Secret's value back.
"""

from __future__ import annotations

import base64

from llamafleet_core import labels as L
from llamafleet_operator.render.common import Manifest

COMPONENT = "agent-token"


def render_agent_token_secret(name: str, namespace: str, token: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {L.APP_PART_OF: L.PART_OF, L.APP_COMPONENT: COMPONENT, L.APP_MANAGED_BY: L.MANAGED_BY},
        },
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }

"""Whether each pod's llama-server resumes a slot restored from a snapshot, and what `up` says about it.

The pod's agent probes it once (agent/restore_check.py) on a model with a sliding window: upstream
llama-server never resumes such a restored slot, and the gateway then restores, primes and saves nothing
on the pod. `up` waits for the probe's result as the pod starts (the agent starts it on its first
`/ready` once llama-server answers), records it in the fleet's progress (`/health`) and warns when
restores are off, with the agent's reason: the user learns why sessions of a known head still compute
it after their slot was reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from llamafleet_core.agent_client import AgentClient, AgentError

POLL_S = 0.2  # the probe is a few prefills of a window's tokens: seconds


def restores_note(pod: str, report: Mapping[str, Any]) -> str | None:
    """The line `up` prints for a probe's result (pure): a warning when restores are off, else None."""
    if report.get("state") != "unusable":
        return None
    return (f"WARNING: {pod}: restores off: {report.get('reason', '')}. Sessions are still routed to the "
            "slots holding their prefix; a patched llama-server with --slot-save-checkpoints makes "
            "restores work (llamafleet build-server --patched)")


async def read_restores(agent: AgentClient, timeout: float) -> dict[str, Any]:
    """The agent's probe result once known (`state` `pending` when it is not within `timeout`, or the
    agent did not say: an agent of an older release)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await agent.ready()  # starts the probe, once llama-server answers
        try:
            report = (await agent.info()).get("restores")
        except AgentError:
            report = None
        if not isinstance(report, dict):
            return {"state": "pending", "reason": "the agent reported no restore probe"}
        if report.get("state") != "pending" or loop.time() >= deadline:
            return report
        await asyncio.sleep(POLL_S)

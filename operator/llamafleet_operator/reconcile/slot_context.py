"""The context each slot of a fleet really has, read back from its pods.

llama-server caps a slot at the model's training context without failing (`the slot context (24576)
exceeds the training context of the model (8192) - capping`): the pods turn ready, and every session or
SharedPrefix longer than the cap fails later, far from the cause. So the operator asks the agents of up
to `MAX_ASKED` ready pods what their server reports (`/v1/info` `slotContext`, from llama-server's
`/props`), records the smallest in `status.slotContext`, and sets the `ContextCapped` condition (an event
on each change) when it is below `contextPerSlot`. A fleet no pod of which answered keeps the last
record: a transient agent error must not flip the condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamafleet_core.agent_client import AgentError
from llamafleet_core.crd.models import LlamaFleetSpec
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import Context, Log
from llamafleet_operator.status import Cond, condition

TYPE = "ContextCapped"
MAX_ASKED = 2  # ready pods asked per reconcile: the pods of one template run one command line


def smallest(answers: Sequence[Mapping[str, Any]]) -> int | None:
    """The smallest positive `slotContext` the agents reported (pure); None when none did."""
    found = [int(a["slotContext"]) for a in answers
             if isinstance(a.get("slotContext"), int) and not isinstance(a.get("slotContext"), bool)
             and a["slotContext"] > 0]
    return min(found, default=None)


def capped_condition(spec: LlamaFleetSpec, slot_context: int | None) -> Cond | None:
    """`ContextCapped` for what the pods reported (pure); None while nothing is known."""
    if slot_context is None:
        return None
    if slot_context < spec.context_per_slot:
        return condition(TYPE, True, "SlotContextCapped",
                         f"llama-server gives each slot {slot_context} tokens, not the "
                         f"{spec.context_per_slot} of contextPerSlot (the model's training context caps "
                         "it): longer sessions and SharedPrefixes fail; lower contextPerSlot or use a "
                         "model trained on more")
    return condition(TYPE, False, "AsRequested", f"each slot holds {slot_context} tokens")


async def ask(ctx: Context, pods: Sequence[P.Pod], logger: Log) -> list[Mapping[str, Any]]:
    """What the agents of up to MAX_ASKED ready pods report (`/v1/info`): the slot context here, the
    restore probe's result for restores.py."""
    answers: list[Mapping[str, Any]] = []
    asked = [p for p in pods if P.ready(p) and not P.deleting(p) and (p.get("status") or {}).get("podIP")]
    for pod in asked[:MAX_ASKED]:
        agent = ctx.agent_of(pod)
        try:
            answers.append(await agent.info())
        except AgentError as exc:
            logger.debug(f"pod report: agent of {P.name(pod)} did not answer: {exc.reason}")
    return answers

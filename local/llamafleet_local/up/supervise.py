"""Keeping a running fleet whole: a pod whose process died is restarted and warmed again.

Choice (documented in `llamafleet up --help`): restart, up to `max_restarts` times per pod, rather than
give up at the first death. A restarted pod comes back at the same URLs with its snapshot folder intact,
so warming it again costs a check (`warm_pod` finds the verified file and re-registers it) or one pull
from a warm peer, never a prefill. While it is down the gateway's `/health` says 503 (not every pod is
up) and routes around it. Beyond `max_restarts`, or with restarts off, `up` stops everything and exits 1,
printing the tail of the dead process's log either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from llamafleet_core.warming import warm_pod
from llamafleet_local.up.procs import ChildFailed, log_tail

if TYPE_CHECKING:
    from llamafleet_local.up.pods import LocalPod
    from llamafleet_local.up.runtime import LocalFleet

POLL_S = 0.5


class FleetFailed(RuntimeError):
    pass


async def supervise(fleet: LocalFleet, stop: asyncio.Event) -> None:
    """Until `stop` is set: watch every process; restart dead pods (or raise FleetFailed)."""
    while not stop.is_set():
        for pod in fleet.pods:
            child = pod.dead()
            if child is None:
                continue
            fleet.reporter.say(f"{child.name} exited with code {child.exit_code}; log {child.log}:\n"
                               f"{log_tail(child.log)}")
            opts = fleet.options
            if not opts.restart or pod.restarts >= opts.max_restarts:
                why = "restarts are off" if not opts.restart else f"{pod.restarts} restarts used"
                raise FleetFailed(f"{child.name} died ({why})")
            if child is pod.agent and pod.server.running:
                await restart_agent(fleet, pod)
            else:
                await restart(fleet, pod)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def restart_agent(fleet: LocalFleet, pod: LocalPod) -> None:
    """Only the agent died: start it again beside the running llama-server, whose requests go on. Its
    snapshot files are still in the folder; it requires what it held, so it is ready again at once."""
    pod.restarts += 1
    fleet.progress.restarts += 1
    try:
        await pod.start_agent(fleet.http, fleet.agent_token, fleet.options.pod_timeout,
                              required=fleet.required_names(pod))
    except ChildFailed as exc:
        await pod.stop()
        raise FleetFailed(f"{pod.name}'s agent did not come back: {exc}") from exc
    fleet.report()
    fleet.write_state()


async def restart(fleet: LocalFleet, pod: LocalPod) -> None:
    """Stop both processes of `pod`, start them again requiring the snapshots it held, warm it."""
    pod.restarts += 1
    fleet.progress.restarts += 1
    fleet.progress.pods_up.discard(pod.name)
    fleet.report()
    await pod.stop()
    try:
        await pod.start(fleet.http, fleet.agent_token, fleet.options.pod_timeout)
    except ChildFailed as exc:
        await pod.stop()
        raise FleetFailed(f"{pod.name} did not come back: {exc}") from exc
    # The gateway sees the pod again only once `require` below has declared what it must hold (its
    # agent's /ready), after warming; it purges the pod's old index entries before that.
    peers = fleet.warm_pods()
    me = next(p for p in peers if p.name == pod.name)
    index = fleet.index.index if fleet.index else None
    for name, result in fleet.results.items():
        state = await warm_pod(result, fleet.sources[name], me, peers=peers, http=fleet.http,
                               agent_token=fleet.agent_token, index=index)
        result.pods = [state if s.pod == pod.name else s for s in result.pods]
        fleet.progress.prefixes[name].pods[pod.name] = state
        if state.state != "warm":
            fleet.reporter.say(f"prefix {name}: pod {pod.name} not warm again: {state.message}")
    await fleet.require(pod)
    pod.ready = True
    fleet.progress.pods_up.add(pod.name)
    fleet.report()
    fleet.write_state()

"""Keeping a running fleet whole: a pod whose process died is restarted and warmed again.

Choice (documented in `llamafleet up --help`): restart, up to `max_restarts` times per pod, rather than
give up at the first death. A restarted pod comes back at the same URLs with its snapshot folder intact,
so warming it again costs a check (`warm_pod` finds the verified file and re-registers it) or one pull
from a warm peer, never a prefill. While it is down the gateway's `/health` says 503 (not every pod is
up) and routes around it. Beyond `max_restarts`, or with restarts off, `up` stops everything and exits 1,
printing the tail of the dead process's log either way.

A restarted pod gets traffic only once every SharedPrefix is warm on it again: its agent runs with
`--await-required`, so its `/ready` (which the gateway routes by) stays 503 until `require` declares
what it holds, and that happens only after warming succeeded for every prefix. When warming fails (no
peer could serve the snapshot, the agent refused it), the pod stays out of rotation rather than serve
cold: the fleet's other pods answer meanwhile and `/health` says which prefix is not warm where. It is
said loudly and warming is tried again, with a growing pause (`WARM_RETRY_S`), until it succeeds. The
same holds for a pod that missed a SharedPrefix at start. What a pod must hold is what the fleet has
(`LocalFleet.missing_on`): a prefix warm on no pod holds none back. The warming at start is here too
(`warm_prefix`, `require_all`): it keeps the same per-pod states that a restart resets and rewarms.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llamafleet_core.prefix import prefix_key_bytes
from llamafleet_core.warming import PodWarmState, PrefixSource, WarmError, warm_pod, warm_shared_prefix
from llamafleet_local.up.contexts import capped_note, fitting_context
from llamafleet_local.up.procs import ChildFailed, log_tail
from llamafleet_local.up.progress import PrefixProgress
from llamafleet_local.up.run_folder import write_state

if TYPE_CHECKING:
    from llamafleet_local.up.pods import LocalPod
    from llamafleet_local.up.runtime import LocalFleet

POLL_S = 0.5
WARM_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # pauses between warming attempts; the last one repeats


class FleetFailed(RuntimeError):
    pass


def missing_prefixes(results: Mapping[str, Any], pod: str) -> list[str]:
    """SharedPrefixes (name -> `WarmResult`) warm on another pod but not on `pod`: until it holds them
    it is not routed to (a session sent there would compute a prefix the fleet has). A prefix warm on
    no pod (it failed everywhere: longer than a slot, say) holds no pod back, or one bad SharedPrefix
    would take the whole fleet out of rotation: the fleet serves without it, `/health` says it is not
    warm, and the warming error was printed."""
    missing = []
    for name, result in results.items():
        states = {s.pod: s.state for s in result.pods}
        warm_elsewhere = any(state == "warm" for other, state in states.items() if other != pod)
        if warm_elsewhere and states.get(pod) != "warm":
            missing.append(name)
    return missing


@dataclass
class _Care:
    """What supervise remembers of one pod between two passes."""

    dead_since: float | None = None  # when it was first seen dead (a restart may wait `restart_delay`)
    warm_failures: int = 0
    warm_again_at: float | None = None  # up but cold (unroutable): when to try warming again


async def supervise(fleet: LocalFleet, stop: asyncio.Event) -> None:
    """Until `stop` is set: watch every process; restart dead pods (or raise FleetFailed) and warm
    again those whose warming failed."""
    # A pod that missed a SharedPrefix at start (`require_all`) is tried again soon.
    care = {pod.name: _Care(warm_failures=1, warm_again_at=time.monotonic() + WARM_RETRY_S[0])
            for pod in fleet.pods if not pod.ready and pod.dead() is None}
    while not stop.is_set():
        for pod in fleet.pods:
            await _tend(fleet, pod, care.setdefault(pod.name, _Care()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLL_S):
                await stop.wait()


async def _tend(fleet: LocalFleet, pod: LocalPod, care: _Care) -> None:
    now = time.monotonic()
    child = pod.dead()
    if child is None:
        if care.warm_again_at is not None and now >= care.warm_again_at:
            await _warm_or_wait(fleet, pod, care)
        return
    opts = fleet.options
    if care.dead_since is None:
        care.dead_since = now
        fleet.reporter.say(f"{child.name} exited with code {child.exit_code}; log {child.log}:\n"
                           f"{log_tail(child.log)}")
        if not opts.restart or pod.restarts >= opts.max_restarts:
            why = "restarts are off" if not opts.restart else f"{pod.restarts} restarts used"
            raise FleetFailed(f"{child.name} died ({why})")
        if child is pod.server or not pod.server.running:
            mark_down(fleet, pod)
    if now - care.dead_since < opts.restart_delay:
        return
    care.dead_since, care.warm_again_at, care.warm_failures = None, None, 0
    if child is pod.agent and pod.server.running:
        await restart_agent(fleet, pod)
    else:
        await restart(fleet, pod)
        await _warm_or_wait(fleet, pod, care)


def mark_down(fleet: LocalFleet, pod: LocalPod) -> None:
    """The pod's server is gone: not up, and none of its SharedPrefixes served there until it is warm
    again (so no peer's warming pulls from it, and `/health` says why it is not ready)."""
    pod.ready = False
    fleet.progress.pods_up.discard(pod.name)
    fleet.route_around(pod)
    for name, result in fleet.results.items():
        state = PodWarmState(pod.name, "pending", message="pod down: restarting")
        result.pods = [state if s.pod == pod.name else s for s in result.pods]
        fleet.progress.prefixes[name].pods[pod.name] = state
    fleet.report()


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
    write_state(fleet)


async def restart(fleet: LocalFleet, pod: LocalPod) -> None:
    """Stop both processes of `pod` and start them again; the pod stays unroutable (its agent awaits
    the declaration of what it must hold) until `rewarm` succeeded."""
    pod.restarts += 1
    fleet.progress.restarts += 1
    mark_down(fleet, pod)
    await pod.stop()
    try:
        await pod.start(fleet.http, fleet.agent_token, fleet.options.pod_timeout)
    except ChildFailed as exc:
        await pod.stop()
        raise FleetFailed(f"{pod.name} did not come back: {exc}") from exc
    await fleet.read_context(pod)
    write_state(fleet)


async def rewarm(fleet: LocalFleet, pod: LocalPod) -> list[str]:
    """Warm every SharedPrefix on `pod`; when all are warm, declare them to its agent (the gateway
    then routes to it) and count it up. Returns what is still cold (empty: the pod is ready)."""
    peers = fleet.warm_pods()
    me = next(p for p in peers if p.name == pod.name)
    index = fleet.index.index if fleet.index else None
    for name, result in fleet.results.items():
        state = await warm_pod(result, fleet.sources[name], me, peers=peers, http=fleet.http,
                               agent_token=fleet.agent_token, index=index)
        result.pods = [state if s.pod == pod.name else s for s in result.pods]
        fleet.progress.prefixes[name].pods[pod.name] = state
    # A prefix warm on no pod holds nobody back (`missing_prefixes`).
    cold = [f"prefix {name}: {fleet.progress.prefixes[name].pods[pod.name].message}"
            for name in fleet.missing_on(pod)]
    if cold:
        fleet.report()
        return cold
    # The gateway purges the pod's old index entries when it sees it again, before routing to it.
    await fleet.require(pod)
    pod.ready = True
    fleet.progress.pods_up.add(pod.name)
    fleet.report()
    write_state(fleet)
    return []


async def _warm_or_wait(fleet: LocalFleet, pod: LocalPod, care: _Care) -> None:
    cold = await rewarm(fleet, pod)
    if not cold:
        if care.warm_failures:
            fleet.reporter.say(f"{pod.name} is warm again and routable")
        care.warm_failures, care.warm_again_at = 0, None
        return
    pause = WARM_RETRY_S[min(care.warm_failures, len(WARM_RETRY_S) - 1)]
    care.warm_failures += 1
    care.warm_again_at = time.monotonic() + pause
    fleet.reporter.say(f"{pod.name} is NOT routable: not warm again ({'; '.join(cold)}); "
                       f"warming again in {pause:.0f}s (attempt {care.warm_failures})")


# --- warming at start (the runtime's `start`) -----------------------------------------------------------

def _on_state(fleet: LocalFleet, track: PrefixProgress) -> Callable[[PodWarmState], None]:
    def update(state: PodWarmState) -> None:
        track.pods[state.pod] = PodWarmState(state.pod, state.state, state.tokens, state.bytes,
                                             state.seconds, state.message)
        fleet.report()
    return update


async def warm_prefix(fleet: LocalFleet, name: str, source: PrefixSource, *, pin: bool) -> None:
    """Warm SharedPrefix `name` on every pod (`warm_shared_prefix`), keeping its progress and result."""
    assert fleet.index is not None
    track = fleet.progress.prefixes.setdefault(name, PrefixProgress(name))
    track.started, track.finished, track.error = time.monotonic(), None, ""
    fleet.sources[name] = source
    fleet.report()
    asked = fleet.config.fleet.spec.context_per_slot
    try:
        result = await warm_shared_prefix(
            source, fleet.warm_pods(), http=fleet.http, agent_token=fleet.agent_token,
            index=fleet.index.index, pin=pin, progress=_on_state(fleet, track),
            max_tokens=fitting_context(fleet.progress.slot_contexts, asked),
            prefix_key=prefix_key_bytes(fleet.prefix_key))
    except WarmError as exc:
        # Too long for a capped slot: say that raising contextPerSlot would not help.
        note = capped_note(fleet.progress.slot_contexts, asked) if exc.reason == "PrefixTooLong" else ""
        track.error = f"{exc}; {note}" if note else str(exc)
        track.finished = time.monotonic()
        fleet.report()
        if note:
            raise WarmError(track.error, reason=exc.reason) from exc
        raise
    fleet.results[name] = result
    track.finished = time.monotonic()
    for state in result.pods:
        if state.state == "failed":
            fleet.reporter.say(f"prefix {name}: pod {state.pod} failed: {state.message}")
    fleet.report()


async def require_all(fleet: LocalFleet) -> None:
    """Declare every pod that holds each SharedPrefix the fleet has. One that missed a prefix another
    pod holds (its pull failed) stays unroutable, as after a restart: `supervise` warms it again (its
    first pass retries soon) and declares it then."""
    for pod in fleet.pods:
        if missing := fleet.missing_on(pod):
            pod.ready = False
            fleet.progress.pods_up.discard(pod.name)
            fleet.reporter.say(f"{pod.name} is NOT routable: prefix {', '.join(missing)} not warm on it; "
                               "warming it again shortly")
            continue
        await fleet.require(pod)
    fleet.report()

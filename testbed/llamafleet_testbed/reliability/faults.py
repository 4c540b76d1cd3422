"""Process faults under a steady workload: a llama-server killed, a pod hung, Redis killed.

Each scenario starts its workload, injects its fault once the workload is under way, and returns a
`ScenarioResult` with the counts and its own measurements; every invariant the issue states is an
`expect(...)` so that the table and the tests read the same verdicts.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_testbed.reliability.bed import PREFIX, Bed, kill, until
from llamafleet_testbed.reliability.client import QUESTIONS, Load
from llamafleet_testbed.reliability.outcome import STALE_CONNECTION, SUCCEEDED, ScenarioResult, Sent

STREAM_TOKENS = 200  # ~1.5 s per stream on the tiny model: a kill lands mid-answer, not after it
REFERENCE_TOKENS = 48  # the cold answers restored ones are compared with (by their start)
PURGE_LIMIT_S = 5.0
# The killed pod stays dead past the purge limit, so only a purge when it goes down can meet the limit
# (the one when it comes back would otherwise hide a missing one).
RESTART_DELAY_S = PURGE_LIMIT_S + 1.5
CUT_END_LIMIT_S = 5.0  # a stream cut by the kill must end (with its error event) within this
REBUILD_LIMIT_S = 15.0  # Redis back: the index holds slot and snapshot entries again within this


def _body(bed: Bed, max_tokens: int = STREAM_TOKENS) -> Callable[[int], dict[str, Any]]:
    return lambda i: bed.body(i, stream=i % 4 != 3, max_tokens=max_tokens)


def _fresh(streams: list[Sent], now: float, within: float = 0.4) -> list[Sent]:
    """Streams whose first bytes came less than `within` seconds ago: most of their answer is still to
    come, so a kill now cuts them rather than racing their last event."""
    return [s for s in streams if s.first_byte is not None and now - s.first_byte < within]


async def kill_server(bed: Bed) -> ScenarioResult:
    """SIGKILL pod 1's llama-server while the client holds a stream from it; `up` restarts it after
    `RESTART_DELAY_S` and warms it again before the gateway may route to it."""
    r = ScenarioResult("kill -9 llama-server", "SIGKILL one of 2 llama-servers mid-workload",
                       pods_killed=True)
    started = time.monotonic()
    victim = bed.pod(1)
    uid, name = victim.layout.llama_url, victim.name
    refs = await bed.references(REFERENCE_TOKENS)
    probes = await bed.chains([bed.body(i) for i in range(len(QUESTIONS))])
    moved_before = bed.sample("llamafleet_router_upstream_retries_total")
    bed.fleet.options.restart_delay = RESTART_DELAY_S
    load = Load(bed.http, [bed.url], _body(bed), count=400, concurrency=4, timeout=30.0)
    running = asyncio.create_task(load.run())
    try:
        await load.wait_done(4)
        r.checks["entries_before"] = await bed.pod_entries(uid, probes)
        # Kill only while a stream from the victim is under way (first bytes in, answer not done).
        await until(lambda: _true(bool(_fresh(load.streaming_on(uid), time.monotonic()))), 20.0,
                    every=0.002)
        held = load.streaming_on(uid)
        waiting = [s for s in load.running.values() if s.first_byte is None]
        killed_at = time.monotonic()
        kill(victim.server.pid)

        async def purged() -> bool:
            return await bed.pod_entries(uid, probes) == 0

        purge_s = await until(purged, PURGE_LIMIT_S, every=0.05)
        # Still none at the limit: nothing wrote entries for the dead pod after the purge.
        await asyncio.sleep(max(0.0, killed_at + PURGE_LIMIT_S - time.monotonic()))
        entries_at_limit = await bed.pod_entries(uid, probes)
        # The pod comes back (supervise restarts it, then warms it): record when the gateway routes to
        # it again, its SharedPrefix's state at that moment, and when its warming finished.
        routable_at = warm_at = None
        state_when_routable = ""
        deadline = time.monotonic() + RESTART_DELAY_S + 60.0
        while time.monotonic() < deadline and (warm_at is None or routable_at is None):
            if routable_at is None and victim.server.running and await bed.pod_ready(1):
                routable_at = time.monotonic()
                state_when_routable = bed.fleet.progress.prefixes[PREFIX].pods[name].state
            if warm_at is None and victim.ready and bed.fleet.progress.restarts >= 1:
                warm_at = time.monotonic()
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)  # some traffic after it is warm
    finally:
        bed.fleet.options.restart_delay = 0.0
        load.stop.set()
        results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    r.wrongly_restored = bed.wrongly_restored(results, refs)
    await bed.check_leaks(r)

    # A stream held at the kill that still reached [DONE] had its last bytes sent already: not cut.
    cut = [s for s in held if s.verdict != SUCCEEDED]
    # The gateway answers 200 only once the pod has answered (it holds the stream's head back until
    # then, so that a pod dying in its prefill can be retried elsewhere). A 200 from the victim ending
    # in an error event is therefore a stream the kill cut, also when its first bytes were still on
    # their way to the client at the kill (seen in CI: one such request counted as "not yet streaming").
    held_ns = {s.n for s in held}
    cut += [s for s in results if s.n not in held_ns and s.pod == uid and s.status == 200
            and s.error_event and s.started < killed_at]
    cut_ns = {s.n for s in cut}
    on_victim = [s for s in results if s.pod == uid]
    before_warm = [s for s in on_victim if s.started > killed_at and (warm_at is None or s.started < warm_at)]
    not_streaming_failed = [s for s in results if s.n not in cut_ns and s.verdict != SUCCEEDED
                            and STALE_CONNECTION not in s.detail]
    r.streams_cut, r.streams_cut_with_error_event = len(cut), sum(s.error_event for s in cut)
    r.purged_after_s = None if purge_s is None else round(purge_s, 2)
    r.checks.update({
        "entries_at_limit": entries_at_limit,
        "restarted": warm_at is not None,
        "streams_held_at_kill": len(held),
        "cut_streams_ended_after_s": round(max((s.ended - killed_at for s in cut), default=0.0), 2),
        "waiting_at_kill": len(waiting),
        "waiting_at_kill_succeeded": sum(s.verdict == SUCCEEDED for s in waiting),
        # Requests the gateway sent to another pod after the victim failed them before their first byte.
        "moved_to_other_pod": int(bed.sample("llamafleet_router_upstream_retries_total") - moved_before),
        # Every other failure: requests the kill caught before their first byte (they carry no pod
        # header when the gateway itself answered 502), or requests the kill never touched.
        "not_streaming_failed": len(not_streaming_failed),
        "prefix_state_when_routable": state_when_routable,
        "routable_before_warm_s": None if routable_at is None or warm_at is None
        else round(max(0.0, warm_at - routable_at), 2),
        "requests_before_warm": len(before_warm),
    })
    r.expect(r.lost == 0, f"{r.lost} requests lost (no answer)")
    r.expect(r.checks["entries_before"] > 0, "the victim had no index entries before the kill")
    r.expect(bool(cut), f"no stream was cut by the kill ({len(held)} held at the kill reached [DONE])")
    r.expect(all(s.error_event for s in cut),
             f"{sum(not s.error_event for s in cut)} of {len(cut)} streams cut by the kill ended without an "
             "SSE error event")
    r.expect(r.checks["cut_streams_ended_after_s"] <= CUT_END_LIMIT_S,
             f"a cut stream ended only {r.checks['cut_streams_ended_after_s']}s after the kill")
    r.expect(not not_streaming_failed,
             f"{len(not_streaming_failed)} requests not yet streaming failed instead of moving pods")
    r.expect(purge_s is not None and purge_s <= PURGE_LIMIT_S and entries_at_limit == 0,
             f"the pod's index entries were still there {PURGE_LIMIT_S:.0f}s after the kill "
             f"({entries_at_limit} left)")
    r.expect(warm_at is not None, f"{name} did not come back warm within 60s")
    r.expect(routable_at is None or state_when_routable == "warm",
             f"the gateway routed to the restarted pod while its SharedPrefix was {state_when_routable!r}")
    # The gateway must not route to the restarted pod before it is warm again: compare when the
    # gateway first saw it routable with when its warming finished (polled every 20 ms here). Counting
    # requests by their client start time cannot tell: one sent before the pod was warm may be routed
    # after it, once it is.
    early = routable_at is not None and warm_at is not None and routable_at < warm_at - 0.25
    r.expect(not early, f"the gateway routed to the restarted pod {r.checks['routable_before_warm_s']}s "
             "before it was warm")
    r.expect(r.wrongly_restored == 0, f"{r.wrongly_restored} answers from a wrong restore")
    return r


async def _true(value: bool) -> bool:
    return value


async def hang_pod(bed: Bed, stopped_s: float = 8.0, down_limit_s: float = 5.0) -> ScenarioResult:
    """SIGSTOP pod 1's llama-server for `stopped_s` seconds under load, then SIGCONT."""
    r = ScenarioResult("SIGSTOP llama-server",
                       f"one of 2 llama-servers hung for {stopped_s:.0f}s, then SIGCONT", pods_killed=True)
    started = time.monotonic()
    victim = bed.pod(1)
    uid = victim.layout.llama_url
    load = Load(bed.http, [bed.url], _body(bed, 16), count=400, concurrency=4, timeout=30.0)
    running = asyncio.create_task(load.run())
    await load.wait_done(6)
    stopped_at = time.monotonic()
    kill(victim.server.pid, signal.SIGSTOP)
    try:
        async def down() -> bool:
            return not await bed.pod_ready(1)

        down_s = await until(down, stopped_s, every=0.05)
        await asyncio.sleep(max(0.0, stopped_s - (time.monotonic() - stopped_at)))
    finally:
        resumed_at = time.monotonic()
        kill(victim.server.pid, signal.SIGCONT)
    back_s = await until(lambda: bed.pod_ready(1), 20.0)
    # It must serve again, not only look routable: wait (bounded) for an answer from it.
    served_s = await until(lambda: _true(any(s.pod == uid and s.verdict == SUCCEEDED
                                             and s.started > resumed_at for s in load.results)), 10.0)
    await asyncio.sleep(1.0)
    load.stop.set()
    results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    await bed.check_leaks(r)
    marked = None if down_s is None else stopped_at + down_s
    stuck = [s for s in results if s.pod == uid and s.started < resumed_at and s.ended > resumed_at
             and s.started >= stopped_at - 1]
    after_mark = [s for s in results
                  if s.pod == uid and marked is not None and marked < s.started < resumed_at]
    r.checks.update({
        "marked_down_after_s": None if down_s is None else round(down_s, 2),
        "back_after_sigcont_s": None if back_s is None else round(back_s, 2),
        "served_after_sigcont": sum(s.pod == uid and s.verdict == SUCCEEDED and s.started > resumed_at
                                    for s in results),
        "waited_for_sigcont": len(stuck),
        "longest_wait_s": round(max((s.ended - s.started for s in results), default=0.0), 2),
        "sent_to_hung_pod_after_marked_down": len(after_mark),
        "served_by_other_pod_while_hung": sum(1 for s in results if s.pod != uid
                                              and stopped_at < s.started < resumed_at),
    })
    r.expect(r.lost == 0, f"{r.lost} requests lost (no answer within 30s)")
    r.expect(down_s is not None and down_s <= down_limit_s,
             f"the hung pod was not marked down within {down_limit_s:.0f}s")
    r.expect(not after_mark, f"{len(after_mark)} requests sent to the hung pod after it was marked down")
    r.expect(not stuck, f"{len(stuck)} requests hung until SIGCONT instead of timing out")
    r.expect(back_s is not None, "the pod was not routable again within 20s of SIGCONT")
    r.expect(served_s is not None, "the pod served no request within 10s of being routable again")
    return r


async def kill_redis(bed: Bed, down_s: float = 3.0) -> ScenarioResult:
    """SIGKILL the index's redis-server under load, restart it empty, check the index is rebuilt."""
    r = ScenarioResult("kill -9 Redis", f"the index's redis-server killed for {down_s:.0f}s, restarted empty")
    started = time.monotonic()
    redis = bed.fleet.redis
    assert redis is not None and redis.proc is not None and bed.fleet.index is not None
    index = bed.fleet.index.index
    snaps_before = len(await index.snapshots(bed.model))
    probes = await bed.chains([bed.body(i) for i in range(len(QUESTIONS))])
    load = Load(bed.http, [bed.url], _body(bed, 8), count=400, concurrency=4, timeout=30.0, gap=0.05)
    running = asyncio.create_task(load.run())
    await load.wait_done(6)
    kill(redis.proc.pid)
    redis.proc.wait(5)
    killed_at = time.monotonic()

    async def degraded() -> bool:
        body = (await bed.http.get(bed.url + "/health")).json()
        return bool(body.get("index") == "degraded")

    degraded_s = await until(degraded, down_s + 2.0)
    await asyncio.sleep(max(0.0, down_s - (time.monotonic() - killed_at)))
    await asyncio.to_thread(redis.start)

    async def healthy() -> bool:
        return not await degraded()

    back_s = await until(healthy, 10.0)

    async def rebuilt() -> bool:
        """Traffic after the index is back wrote slot entries, and the resync the snapshots'."""
        try:
            slots = sum([await bed.pod_entries(p.layout.llama_url, probes) for p in bed.fleet.pods])
            return slots > 0 and len(await index.snapshots(bed.model)) >= snaps_before
        except IndexUnavailable:  # a slow answer on a loaded machine: asked again at the next poll
            return False

    await until(rebuilt, REBUILD_LIMIT_S, every=0.1)
    load.stop.set()
    results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    await bed.check_leaks(r)
    slots_after = sum([await bed.pod_entries(p.layout.llama_url, probes) for p in bed.fleet.pods])
    snaps_after = len(await index.snapshots(bed.model))
    r.checks.update({
        "degraded_reported_after_s": None if degraded_s is None else round(degraded_s, 2),
        "ok_again_after_restart_s": None if back_s is None else round(back_s, 2),
        "during_outage": sum(1 for s in results if killed_at < s.started < killed_at + down_s),
        "entries_after": slots_after, "snapshots_before": snaps_before, "snapshots_after": snaps_after,
    })
    r.expect(r.other_failed == 0 and r.lost == 0,
             f"{r.other_failed} failed and {r.lost} lost while Redis was down")
    r.expect(degraded_s is not None, "/health never reported the index degraded")
    r.expect(back_s is not None, "/health did not report the index ok again within 10s")
    r.expect(snaps_before > 0, "no snapshot entries before the outage: their rebuild went untested")
    r.expect(slots_after > 0, "no slot entries in the index after Redis came back")
    r.expect(snaps_after >= snaps_before,
             f"snapshot entries not rebuilt: {snaps_after} after, {snaps_before} before the outage")
    return r




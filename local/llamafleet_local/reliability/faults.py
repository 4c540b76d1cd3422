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

from llamafleet_local.reliability.bed import Bed, kill, until
from llamafleet_local.reliability.client import QUESTIONS, Load
from llamafleet_local.reliability.outcome import STALE_CONNECTION, SUCCEEDED, ScenarioResult

STREAM_TOKENS = 48  # long enough for streams to be in progress when the fault hits
PURGE_LIMIT_S = 5.0


def _body(bed: Bed, max_tokens: int = STREAM_TOKENS) -> Callable[[int], dict[str, Any]]:
    return lambda i: bed.body(i, stream=i % 4 != 3, max_tokens=max_tokens)


async def kill_server(bed: Bed) -> ScenarioResult:
    """SIGKILL pod 1's llama-server while requests stream from it; `up` restarts and re-warms it."""
    r = ScenarioResult("kill -9 llama-server", "SIGKILL one of 2 llama-servers mid-workload",
                       pods_killed=True)
    started = time.monotonic()
    victim = bed.pod(1)
    uid, name = victim.layout.llama_url, victim.name
    refs = await bed.references(STREAM_TOKENS)
    probes = [bed.body(i) for i in range(len(QUESTIONS))]
    load = Load(bed.http, [bed.url], _body(bed), count=400, concurrency=4, timeout=30.0)
    running = asyncio.create_task(load.run())
    await load.wait_done(6)
    await until(lambda: _true(bed.gateway.in_flight.count(uid) > 0), 5.0, every=0.005)
    r.checks["entries_before"] = await bed.pod_entries(uid, probes)
    purges = watch_purges(bed, uid)
    killed_at = time.monotonic()
    kill(victim.server.pid)

    async def purged() -> bool:
        # The fence purges at once and the restarted pod records new entries right after (resync,
        # warming, traffic), so the purge itself is the event to time; an empty index is the fallback.
        return bool(purges) or await bed.pod_entries(uid, probes) == 0

    purge_s = await until(purged, 15.0, every=0.05)
    if purges:
        purge_s = purges[0] - killed_at
    r.checks["entries_gone_after_s"] = None if purge_s is None else round(purge_s, 2)
    # The pod comes back (supervise restarts it, then warms it): record when the gateway routes to it
    # again and when its warming finished, while the workload keeps running.
    routable_at = warm_at = None
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline and warm_at is None:
        if routable_at is None and victim.server.running and await bed.pod_ready(1):
            routable_at = time.monotonic()
        if victim.ready and bed.fleet.progress.restarts >= 1:
            warm_at = time.monotonic()
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)  # some traffic after it is warm
    load.stop.set()
    results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    r.wrongly_restored = bed.wrongly_restored(results, refs)

    on_victim = [s for s in results if s.pod == uid]
    in_progress = [s for s in on_victim if s.started < killed_at < s.ended and s.ended - killed_at < 10]
    # A stream the client had bytes of: the gateway holds a stream back until it answers, so a
    # request with no byte at all is one the kill caught before it answered (it must move pods). The
    # client's own clock cannot tell: its first byte may arrive just after the kill it preceded.
    streaming = [s for s in in_progress if s.first_byte is not None]
    before_warm = [s for s in on_victim if s.started > killed_at and (warm_at is None or s.started < warm_at)]
    r.checks.update({
        "restarted": warm_at is not None, "in_progress_on_victim": len(in_progress),
        "streams_cut": len(streaming),
        "streams_cut_with_error_event": sum(s.error_event for s in streaming),
        # Every other failure: requests the kill caught before their first byte (they carry no pod
        # header when the gateway itself answered 502), or requests the kill never touched.
        "not_streaming_failed": sum(s.verdict != SUCCEEDED and STALE_CONNECTION not in s.detail
                                    for s in results if s not in streaming),
        "routable_before_warm_s": None if routable_at is None or warm_at is None
        else round(max(0.0, warm_at - routable_at), 2),
        "requests_before_warm": len(before_warm),
    })
    r.expect(r.lost == 0, f"{r.lost} requests lost (no answer)")
    r.expect(all(s.error_event for s in streaming if s.stream and s.verdict != SUCCEEDED),
             "a stream cut by the kill ended without an SSE error event")
    r.expect(r.checks["not_streaming_failed"] == 0,
             f"{r.checks['not_streaming_failed']} requests not yet streaming failed instead of moving pods")
    r.expect(purge_s is not None and purge_s <= PURGE_LIMIT_S,
             f"the pod's index entries were still there {PURGE_LIMIT_S:.0f}s after the kill "
             f"(gone after {r.checks['entries_gone_after_s']}s)")
    r.expect(warm_at is not None, f"{name} did not come back warm within 60s")
    # The gateway must not route to the restarted pod before it is warm again: compare when the
    # gateway first saw it routable with when its warming finished (polled every 20 ms here). Counting
    # requests by their client start time cannot tell: one sent before the pod was warm may be routed
    # after it, once it is.
    early = routable_at is not None and warm_at is not None and routable_at < warm_at - 0.25
    r.expect(not early, f"the gateway routed to the restarted pod {r.checks['routable_before_warm_s']}s "
             "before it was warm")
    r.expect(r.wrongly_restored == 0, f"{r.wrongly_restored} answers from a wrong restore")
    return r


def watch_purges(bed: Bed, uid: str) -> list[float]:
    """Times at which the index purged pod `uid` (the gateway's fencing), by wrapping the index object
    the gateway holds; the list fills as purges happen."""
    assert bed.fleet.index is not None
    index: Any = bed.fleet.index.index
    times: list[float] = []
    inner = index.purge_pod

    async def purge_pod(pod_uid: str) -> int:
        removed = int(await inner(pod_uid))
        if pod_uid == uid:
            times.append(time.monotonic())
        return removed

    index.purge_pod = purge_pod
    return times


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
    await asyncio.sleep(1.0)
    load.stop.set()
    results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
    marked = None if down_s is None else stopped_at + down_s
    stuck = [s for s in results if s.pod == uid and s.started < resumed_at and s.ended > resumed_at
             and s.started >= stopped_at - 1]
    after_mark = [s for s in results
                  if s.pod == uid and marked is not None and marked < s.started < resumed_at]
    r.checks.update({
        "marked_down_after_s": None if down_s is None else round(down_s, 2),
        "back_after_sigcont_s": None if back_s is None else round(back_s, 2),
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
    return r


async def kill_redis(bed: Bed, down_s: float = 3.0) -> ScenarioResult:
    """SIGKILL the index's redis-server under load, restart it empty, check the index is rebuilt."""
    r = ScenarioResult("kill -9 Redis", f"the index's redis-server killed for {down_s:.0f}s, restarted empty")
    started = time.monotonic()
    redis = bed.fleet.redis
    assert redis is not None and redis.proc is not None and bed.fleet.index is not None
    index = bed.fleet.index.index
    snaps_before = len(await index.snapshots(bed.model))
    probes = [bed.body(i) for i in range(len(QUESTIONS))]
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
    await asyncio.sleep(1.5)  # traffic after the index is back rebuilds slot entries
    load.stop.set()
    results = await running
    r.add(results)
    r.finish()
    r.seconds = time.monotonic() - started
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
    r.expect(slots_after > 0, "no slot entries in the index after Redis came back")
    r.expect(snaps_after >= snaps_before,
             f"snapshot entries not rebuilt: {snaps_after} after, {snaps_before} before the outage")
    return r




"""Fault injection under a steady agent workload: every scenario's invariants, and its figures.

A scenario reports every invariant it saw broken (`ScenarioResult.problems`); any broken invariant
fails the test.
"""

from __future__ import annotations

import pytest

from llamafleet_testbed.reliability.bed import Bed
from llamafleet_testbed.reliability.faults import hang_pod, kill_redis, kill_server
from llamafleet_testbed.reliability.outcome import ScenarioResult
from llamafleet_testbed.reliability.replicas import kill_gateway
from llamafleet_testbed.reliability.snapshots import bad_snapshots, kill_agent

pytestmark = [pytest.mark.reliability, pytest.mark.llama, pytest.mark.redis]

def check(result: ScenarioResult) -> None:
    print(result.as_dict())  # the figures, in the test log
    assert not result.problems, result.problems


async def test_requests_move_and_streams_end_with_an_error_when_a_llama_server_is_killed(bed: Bed) -> None:
    """kill -9 of one llama-server while a stream from it is under way: no request lost; the streams the
    kill cut (at least one) end with an SSE error event; requests that had not started streaming are
    answered by the other pod; the pod's index entries are gone within 5 s, while it is still dead
    (its restart is delayed past that); `up` restarts it and it gets traffic only once warm. Nothing
    stays in flight or leased."""
    result = await kill_server(bed)
    assert result.checks["restarted"] and result.lost == 0, result.checks
    assert result.streams_cut and result.streams_cut == result.streams_cut_with_error_event, result.checks
    assert result.purged_after_s is not None and result.purged_after_s <= 5.0
    assert result.checks["entries_before"] > 0 and result.checks["entries_at_limit"] == 0
    assert result.checks["prefix_state_when_routable"] == "warm"
    check(result)


async def test_the_snapshot_is_not_used_when_the_agent_dies_mid_transfer(bed: Bed) -> None:
    """The agent a peer pulls from is killed (its pod's link cut) after part of the file crossed: the
    pull fails, the answer comes right without the cut snapshot, and the puller shows no copy of it."""
    result = await kill_agent(bed)
    assert result.checks["transfers_cut"] == 2 and result.wrongly_restored == 0, result.checks
    assert all(t["pull_failures"] >= 1 and 0 < t["bytes_relayed"] < t["size"]
               for t in result.checks["transfers"]), result.checks
    check(result)


async def test_no_request_fails_when_redis_dies_and_the_index_is_rebuilt_after(bed: Bed) -> None:
    """Redis SIGKILLed for 3 s and restarted empty: 0 failed or lost, /health says degraded meanwhile and
    ok after, and the index holds the pods' slots and snapshots again."""
    result = await kill_redis(bed)
    assert result.other_failed == 0 and result.lost == 0, result.checks
    assert result.checks["degraded_reported_after_s"] is not None
    assert result.checks["snapshots_before"] > 0
    check(result)


async def test_clients_retrying_get_answers_when_a_gateway_replica_is_killed(bed: Bed) -> None:
    """Two replicas over the same pods and Redis, one SIGKILLed while it holds a slot lease: every
    request is answered (retried on the other replica when the first gave no answer), and the dead
    replica's leases expire within their TTL."""
    result = await kill_gateway(bed)
    assert result.sent > 10 and result.succeeded + result.stale_connection == result.sent, result.checks
    assert result.checks["leases_of_killed_replica"] > 0
    assert result.checks["its_leases_expired_after_s"] is not None
    check(result)


async def test_traffic_moves_and_the_pod_returns_when_a_llama_server_hangs(bed: Bed) -> None:
    """One llama-server SIGSTOPped for 8 s: no request lost, it is marked down, traffic moves to the
    other pod; after SIGCONT it is routable again and serves requests."""
    result = await hang_pod(bed)
    assert result.lost == 0 and result.checks["back_after_sigcont_s"] is not None, result.checks
    assert result.checks["served_by_other_pod_while_hung"] > 0
    assert result.checks["served_after_sigcont"] > 0
    check(result)


async def test_every_damaged_or_mismatched_snapshot_is_refused(bed: Bed) -> None:
    """Corrupted, truncated, other model digest, other KV type: 4/4 refused by the agent, 0 restored
    through the gateway, every request answered."""
    result = await bad_snapshots(bed)
    assert result.checks["refused_by_agent"] == {
        "corrupt": "checksum", "truncate": "size", "other_model": "fingerprint", "other_kv": "fingerprint"}
    assert result.wrongly_restored == 0 and result.succeeded == result.sent == 4
    check(result)

"""First-sight flights are per tenant group: with `key_tenants`, concurrent first sessions of one
never-seen head from two groups each build their own (a group never waits for, nor learns by the wait
of, another group's build), while two keys of one group share a single build as ever.

At the unit level (the flight registry keyed through the real prompt identity, tenancy and prefix key)
and through the real gateway (real uvicorn and snapshot flow, fake pods whose `/tokenize` the test
holds open, `first_sight_pods.py`, so each build's flight stays open until the test lets it end: no
timing involved).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from pydantic import SecretStr

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.prefix import ChatTemplate, chat_identity, prefix_key_bytes
from llamafleet_router.access.tenancy import Tenancy
from llamafleet_router.settings import RouterSettings
from llamafleet_router.snapshots import SnapshotConfig
from llamafleet_router.snapshots.flights import Flights, Prompt, StageFlights
from tests.security.first_sight_pods import PROPS, first_sight_pods
from tests.security.tenant_bed import gateway

KEYS = {"alice": "alice-secret-0123456789", "alice2": "alice2-secret-0123456789",
        "bob": "bob-secret-0123456789", "ops": "ops-secret-0123456789"}
GROUPS = ["alice:a", "alice2:a", "bob:b"]
SECRET = "fleet-secret-0123456789abcdef"
# Long enough for a first sight (`first_sight_min_chars`) with stage points (paragraphs, a last line).
SYSTEM = ("You are the payroll assistant of team A.\n\n" + "Rules of the salary table follow. " * 60
          + "\n\nMore confidential rules. " * 30 + "\n\nConversation started: Monday")
BODY = {"model": "fake", "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]}
FIRST_SIGHT = "llamafleet_router_snapshot_first_sight_total"


def prompt_of(key_name: str, tenancy: Tenancy) -> Prompt:
    """What the gateway's first sight keys a request of `key_name` by (gateway.py -> flow.py)."""
    identity = chat_identity(BODY, ChatTemplate.from_props(PROPS), model="fake",
                             namespace=tenancy.namespace(key_name), key=prefix_key_bytes(SECRET))
    return Prompt("fake", identity.text, identity.blocks, identity.shared_chars, identity.hasher)


async def test_the_flight_registry_gives_each_tenant_group_its_own_flight_of_one_head() -> None:
    tenancy = Tenancy.build(auth_enabled=True, admin_keys=(), expose_routing_headers=False,
                            key_tenants=GROUPS, known_keys=KEYS)
    alice, alice2, bob = (prompt_of(k, tenancy) for k in ("alice", "alice2", "bob"))
    assert alice.text == bob.text  # the very same head, sent by two groups
    flights = Flights()
    a_leads, a_flight = flights.join(alice.flight_key(alice.head_chars))
    b_leads, b_flight = flights.join(bob.flight_key(bob.head_chars))
    a2_leads, a2_flight = flights.join(alice2.flight_key(alice2.head_chars))
    assert a_leads and b_leads and b_flight is not a_flight  # bob builds his own, never waits for alice's
    assert not a2_leads and a2_flight is a_flight  # alice's other key waits for alice's build
    # The stages a build saves (and another session may wait for) are per group too.
    stages = StageFlights(flights, SnapshotConfig(token="t", first_sight_min_chars=256))
    alice_stages, bob_stages = stages.keys(alice, 0), stages.keys(bob, 0)
    assert alice_stages and alice_stages.keys() == bob_stages.keys()
    assert set(alice_stages.values()).isdisjoint(bob_stages.values())
    assert stages.keys(alice2, 0) == alice_stages


def count(gw: Any, role: str) -> float:
    return gw.state.metrics.registry.get_sample_value(FIRST_SIGHT, {"role": role}) or 0.0


async def until_counted(gw: Any, role: str, want: float, timeout: float = 20.0) -> None:
    """Wait until the gateway has counted `want` first sights in `role` (polled, with a deadline)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while count(gw, role) < want:
        assert asyncio.get_running_loop().time() < deadline, f"{count(gw, role)} {role}s, {want} expected"
        await asyncio.sleep(0.01)


async def test_through_the_gateway_two_groups_build_a_head_each_and_one_group_builds_it_once() -> None:
    """alice's first session of a head holds its build open; bob (another group) sends the same head:
    his request starts a build of its own (a second `/tokenize`) instead of waiting for alice's; then
    alice2 (alice's group) sends it and waits for alice's build (a waiter, no third build)."""
    async with first_sight_pods(2) as (held, pods):  # 2 slots each: three sessions hold a slot at once
        settings = RouterSettings(
            pods=pods, poll_interval=0.2, agent_token=SecretStr("agent-token"),
            api_keys=SecretStr(",".join(f"{n}:{k}" for n, k in KEYS.items())), key_tenants=GROUPS,
            prefix_key=SecretStr(SECRET), first_sight_min_chars=512)
        async with gateway(settings, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases()) as gw, \
                httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            def send(name: str) -> asyncio.Task[httpx.Response]:
                headers = {"Authorization": f"Bearer {KEYS[name]}"}
                return asyncio.create_task(http.post("/v1/chat/completions", json=BODY, headers=headers))

            alice = send("alice")
            await held.until_asked(1)  # alice leads: her flight is open
            bob = send("bob")
            await held.until_asked(2)  # bob leads a build of his own, though alice's still runs
            assert (count(gw, "leader"), count(gw, "waiter")) == (2, 0)
            alice2 = send("alice2")
            await until_counted(gw, "waiter", 1)  # alice2 joins alice's flight
            held.released.set()
            answers = await asyncio.gather(alice, bob, alice2)
        assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
        assert held.asked == 2  # alice2 never started a build
        assert (count(gw, "leader"), count(gw, "waiter")) == (2, 1)

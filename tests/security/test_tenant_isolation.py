"""Tenants of one gateway, kept apart: fleets by identity, requests by the gateway's own ids, API keys by
what they may see of each other (real uvicorn and proxy path, fake pods, real Redis where the
membership, the index or the leases are involved):

- two fleets in the Redis membership that report one model name: neither gets a request for it (503
  `model_conflict`, listed in `/health` and counted) until `model_fleets` names one, which then gets all
  of them;
- two requests sharing a client's `x-request-id`: each holds its own slot lease, and the late release of
  the first leaves the second's in place (in this replica and in Redis);
- the `x-llamafleet-*` routing headers only for admin keys (or when `expose_routing_headers` says so);
- keys of different tenant groups never find each other's prefixes in the index (one group's prompt is a
  cold compute for the other), while a group finds its own.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.types import SlotRef
from llamafleet_router.settings import RouterSettings
from tests.fuzz.fake_pod import FAKE_FIELDS
from tests.security.tenant_bed import gateway, json_log_lines, pod, write_fleet

pytestmark = pytest.mark.redis

CHAT = "/v1/chat/completions"
KEYS = {"alice": "alice-secret-0123456789", "bob": "bob-secret-0123456789", "ops": "ops-secret-0123456789"}
ROUTING = ("x-llamafleet-pod", "x-llamafleet-slot", "x-llamafleet-action")
# Long enough for several 256-character blocks: what the index matches prompts by.
SYSTEM = "You are the billing assistant of team A. Confidential rules follow. " * 20


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def chat(system: str = SYSTEM, question: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 2, **extra,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def settings(**fields: Any) -> RouterSettings:
    keys = ",".join(f"{name}:{key}" for name, key in KEYS.items())
    return RouterSettings(**{"api_keys": SecretStr(keys), "poll_interval": 0.2,
                             "extra_fields": list(FAKE_FIELDS), **fields})


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


# --- fleets by identity --------------------------------------------------------------------------------


async def test_a_model_two_fleets_report_goes_to_neither_until_mapped_then_only_to_its_fleet(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """The review's hijack: team-a's fleet names team-b's model. Without a mapping neither fleet's pods
    receive a request for it; with `model_fleets` every request goes to the mapped fleet only."""
    async with pod() as pod_a, pod() as pod_b:
        p = prefix()
        await write_fleet(redis, "team-a/tiny", [pod_a], p)
        await write_fleet(redis, "team-b/tiny", [pod_b], p)
        common = {"discovery": "redis", "redis_url": redis_url, "index": "memory", "index_prefix": p,
                  "member_networks": ["127.0.0.0/8"], "admin_keys": ["ops"]}

        async with gateway(settings(**common), index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(),
                           redis=redis) as gw, httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
            refused = [await http.post(CHAT, json=chat(), headers=auth("bob")) for _ in range(4)]
            health = (await http.get("/health", headers=auth("ops"))).json()
            metrics = (await http.get("/metrics", headers=auth("ops"))).text
        for resp in refused:
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "model_conflict" and error["param"] == "model"
            assert "team-a/tiny" in error["message"] and "team-b/tiny" in error["message"]
        assert pod_a.received == [] and pod_b.received == []
        assert health["model_conflicts"] == {"fake": ["team-a/tiny", "team-b/tiny"]}
        assert health["pods_up"] == 2  # the pods are fine: only the name is ambiguous
        assert "llamafleet_router_model_conflicts 1.0" in metrics

        mapped = settings(**common, model_fleets=["fake=team-b/tiny"])
        async with gateway(mapped, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases(),
                           redis=redis) as gw, httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
            answers = [await http.post(CHAT, json=chat(question=f"q{i}"), headers=auth("bob"))
                       for i in range(12)]
            health = (await http.get("/health", headers=auth("ops"))).json()
        assert [r.status_code for r in answers] == [200] * 12
        assert len(pod_b.received) == 12 and pod_a.received == []
        assert health["model_conflicts"] == {}


# --- request ids ---------------------------------------------------------------------------------------


class GatedIndex(InMemoryPrefixIndex):
    """An index whose slot records for one slot wait for `opened` while armed: the finished request's
    after-response work (record, then release its lease) is held back at will."""

    def __init__(self) -> None:
        super().__init__()
        self.armed_slot: int | None = None
        self.opened = asyncio.Event()

    async def record_slot(self, model: str, slot: SlotRef, *args: Any, **kwargs: Any) -> None:
        if self.armed_slot is not None and slot.slot == self.armed_slot:
            await self.opened.wait()
        await super().record_slot(model, slot, *args, **kwargs)


async def first_event(resp: httpx.Response) -> AsyncIterator[bytes]:
    """Read the stream's first bytes; the iterator returned keeps it open (closing it would end it)."""
    chunks = resp.aiter_raw()
    while not await anext(chunks):
        pass
    return chunks


async def test_two_requests_with_one_client_request_id_hold_their_own_leases(redis_url: str) -> None:
    """A client reuses `x-request-id`. Its first request ends on slot S, and that request's lease release
    is late (its index record is held back); the second, same id, takes S meanwhile. When the late
    release runs, the second request must still hold S: in this replica and in Redis."""
    client = connect_index(redis_url)
    index, leases = GatedIndex(), RedisSlotLeases(client, prefix=prefix())
    try:
        async with pod() as fake, gateway(settings(pods=[fake.url], admin_keys=["ops"]), index=index,
                                          leases=leases) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=15) as http:
                with json_log_lines() as lines:
                    # C keeps one slot busy: the only idle slot is then S, for A and for B.
                    long_c = chat("another prompt", "c", stream=True, fake_events=10_000)
                    async with http.stream("POST", CHAT, json=long_c, headers=auth("ops")) as c:
                        held_by_c = int(c.headers["x-llamafleet-slot"])
                        c_open = await first_event(c)
                        index.armed_slot = s = 1 - held_by_c
                        same = {**auth("ops"), "x-request-id": "client-session-7"}
                        a = await http.post(CHAT, json=chat(question="a"), headers=same)
                        assert (a.status_code, int(a.headers["x-llamafleet-slot"])) == (200, s)
                        long_b = chat(question="b", stream=True, fake_events=10_000)
                        async with http.stream("POST", CHAT, json=long_b, headers=same) as b:
                            assert int(b.headers["x-llamafleet-slot"]) == s
                            assert b.headers["x-request-id"] == "client-session-7"  # echoed as sent
                            b_open = await first_event(b)
                            ref = SlotRef(fake.url, s)  # static pods: the uid is the URL
                            assert gw.state.leases.held() == 2
                            index.opened.set()  # A's late release runs now
                            await gw.state.tasks.drain(10.0)
                            assert gw.state.leases.held() == 2, "A's release dropped B's hold"
                            assert await leases.holder(ref) == gw.state.leases.replica
                            del b_open, c_open  # the streams end with their blocks
                    finished = await lines.until_finished(3)
            await gw.state.tasks.drain(10.0)
            assert gw.state.leases.held() == 0
        ids = {entry["request_id"] for entry in finished}
        assert len(ids) == len(finished) == 3  # the gateway's own ids, one per request
        assert sorted(e.get("client_request_id") or "" for e in finished) == ["", "client-session-7",
                                                                              "client-session-7"]
    finally:
        await client.aclose()


# --- what keys see of each other ----------------------------------------------------------------------


async def test_routing_headers_go_to_admin_keys_only_unless_exposed() -> None:
    """A tenant key learns nothing of the cache state from the headers; an admin key does, and with
    `expose_routing_headers` every key does."""
    async with pod() as fake:
        async with gateway(settings(pods=[fake.url], admin_keys=["ops"]), index=InMemoryPrefixIndex(),
                           leases=InMemorySlotLeases()) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            tenant = await http.post(CHAT, json=chat(), headers=auth("alice"))
            admin = await http.post(CHAT, json=chat(), headers=auth("ops"))
        assert tenant.status_code == admin.status_code == 200
        assert not [h for h in tenant.headers if h.startswith("x-llamafleet-")]
        assert all(h in admin.headers for h in ROUTING)
        exposing = settings(pods=[fake.url], expose_routing_headers=True)
        async with gateway(exposing, index=InMemoryPrefixIndex(), leases=InMemorySlotLeases()) as gw, \
                httpx.AsyncClient(base_url=gw.url) as http:
            exposed = await http.post(CHAT, json=chat(), headers=auth("alice"))
        assert all(h in exposed.headers for h in ROUTING)


async def test_tenant_groups_never_find_each_others_prefixes(redis_url: str) -> None:
    """alice (group a) sends a confidential system prompt; bob (group b) sends the very same prompt: for
    him it is a cold compute, nothing predicted. alice's own next request with it is a slot hit, and so
    is bob's second one (within his group, caching works as ever)."""
    client = connect_index(redis_url)
    index = RedisPrefixIndex(client, prefix=prefix())
    try:
        async with pod() as fake:
            config = settings(pods=[fake.url], key_tenants=["alice:a", "bob:b"])
            async with gateway(config, index=index, leases=RedisSlotLeases(client, prefix=prefix())) as gw, \
                    httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
                with json_log_lines() as lines:
                    for who in ("alice", "bob", "alice", "bob"):
                        resp = await http.post(CHAT, json=chat(question=f"from {who}"), headers=auth(who))
                        assert resp.status_code == 200
                        await gw.state.tasks.drain(10.0)  # its index record is in before the next one
        decisions = lines.finished()
        assert [d["key"] for d in decisions] == ["alice", "bob", "alice", "bob"]
        first_alice, first_bob, again_alice, again_bob = decisions
        assert first_bob["predicted_blocks"] == 0 and first_bob["branch"] != "slot_hit", first_bob
        assert again_alice["predicted_blocks"] > 0 and again_alice["branch"] == "slot_hit", again_alice
        assert again_bob["predicted_blocks"] > 0 and again_bob["branch"] == "slot_hit", again_bob
        assert first_alice["predicted_blocks"] == 0
    finally:
        await client.aclose()


@pytest.mark.parametrize(("field", "value"), [
    ("model_fleets", "fake"), ("model_fleets", "fake=team-b"), ("model_fleets", "fake=a/x,fake=b/y"),
    ("key_tenants", "alice"), ("key_tenants", "alice:"), ("key_tenants", "alice:a,alice:b"),
    ("index_prefix", ""), ("index_prefix", "lf:x"), ("index_prefix", "a b"),
])
def test_malformed_tenancy_settings_are_refused_at_start(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field if field == "index_prefix" else "must be|two"):
        RouterSettings(**{field: value})


def test_tenancy_settings_as_the_environment_gives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFLEET_ROUTER_MODEL_FLEETS", "fake=team-b/tiny, other=team-a/big")
    monkeypatch.setenv("LLAMAFLEET_ROUTER_KEY_TENANTS", "alice:a,bob:b")
    monkeypatch.setenv("LLAMAFLEET_ROUTER_ADMIN_KEYS", "ops")
    s = RouterSettings()
    assert s.model_fleets == ["fake=team-b/tiny", "other=team-a/big"]
    assert (s.key_tenants, s.admin_keys, s.expose_routing_headers, s.index_prefix) == (
        ["alice:a", "bob:b"], ["ops"], False, "lf")

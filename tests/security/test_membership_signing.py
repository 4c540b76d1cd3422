"""Finding 6 (signed membership): a Redis writer must not be able to add a fleet member.

With a membership key the operator signs every entry (HMAC-SHA256 of its canonical JSON, bound to the
key prefix, namespace and fleet: `llamafleet_core.membership_signing`), and the router's membership
discovery drops entries whose signature is missing or wrong: logged once, counted on
`llamafleet_router_members_ignored{reason}`. Real Redis; the operator is the real one (kopf handlers
over the kmock emulator); the pods are the router tests' fakes (only membership is under test).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Gauge

from llamafleet_core import membership
from llamafleet_core.membership import Member, encode, members_key, write_members
from llamafleet_core.membership_signing import BadSeal, Scope, membership_key, seal, unseal
from llamafleet_operator.settings import OperatorSettings
from llamafleet_router.discovery.membership import MembershipDiscovery
from llamafleet_router.settings import RouterSettings
from tests.operator.kmock_support import KubeEmulator
from tests.operator.operator_bed import (
    DEPLOYMENTS,
    NS,
    create,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    running_operator,
)
from tests.router.fakes import FakeFleet, FakePod

KEY = membership_key("membership-key-of-the-test-0123456789")
HERE = Scope("lf", "team-a", "chat")


def member(i: int, *, ip: str | None = None) -> Member:
    return Member(name=f"pod-{i}", uid=f"uid-{i}", ip=ip or f"10.0.0.{i}", port=8080, agent_port=8090,
                  slots=2, model="tiny", ready=True, epoch=1000 + i)


def edited(sealed: str, **fields: object) -> str:
    data = json.loads(sealed)
    data.update(fields)
    return json.dumps(data)


def reason(raw: str, scope: Scope = HERE, key: bytes = KEY) -> str | None:
    try:
        unseal(raw, scope, key)
    except BadSeal as bad:
        return bad.reason
    return None


def test_a_signed_entry_verifies_for_its_own_fleet_only() -> None:
    sealed = seal(encode(member(1)), HERE, KEY)
    assert membership.from_fields(unseal(sealed, HERE, KEY)) == member(1)
    assert membership.decode(sealed) == member(1)  # a router without a key ignores `sig`
    assert reason(json.dumps(json.loads(sealed))) is None  # re-serialised: the canonical form is checked
    for tampered in ({"ip": "10.0.0.66"}, {"port": 8081}, {"agentPort": 1}, {"uid": "uid-2"},
                     {"ready": False}, {"warm": ["p"]}, {"extra": 1}):
        assert reason(edited(sealed, **tampered)) == "signature", tampered
    for elsewhere in (Scope("lf", "team-a", "other"), Scope("lf", "team-b", "chat"),
                      Scope("xx", "team-a", "chat")):
        assert reason(sealed, elsewhere) == "signature", elsewhere
    assert reason(sealed, key=membership_key("another key")) == "signature"
    assert reason(encode(member(1))) == "unsigned"
    for junk in ("{not json", "[]", '"text"', edited(sealed, sig=None), edited(sealed, sig="\u00e9\ud800")):
        assert reason(junk) in ("unsigned", "signature"), junk


def test_the_key_comes_from_the_setting_or_its_file_on_both_sides(tmp_path: Path) -> None:
    key_file = tmp_path / "membership-key"
    key_file.write_text("from-the-file\nsecond line\n")
    from_file = membership_key("from-the-file")
    assert OperatorSettings(membership_key_file=key_file).resolved_membership_key() == from_file
    assert RouterSettings(membership_key_file=key_file).resolved_membership_key() == from_file
    given = RouterSettings(membership_key="given", membership_key_file=key_file)  # type: ignore[arg-type]
    assert given.resolved_membership_key() == membership_key("given")
    assert OperatorSettings().resolved_membership_key() == RouterSettings().resolved_membership_key() == b""
    assert len(membership_key("x")) == 32 and membership_key("x") != b"x" * 32


def fake_fleet(*members: Member) -> FakeFleet:
    fleet = FakeFleet(*(FakePod(m.url) for m in members))
    for m in members:
        fleet.agents_ready[m.agent_url] = True
    return fleet


def ignored_by_reason(registry: CollectorRegistry) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in registry.collect() for s in f.samples if s.value}


@pytest.mark.redis
async def test_injected_and_copied_entries_are_dropped_and_signed_ones_kept(
    redis: aioredis.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    await write_members(redis, "team-a", "chat", [member(1)], prefix=prefix, signing_key=KEY)
    await write_members(redis, "team-b", "other", [member(2)], prefix=prefix, signing_key=KEY)
    # A Redis writer adds three members to team-a/chat: unsigned, signed with a guessed key, and team-b's
    # own signed entry copied over (a real pod, but of another tenant's fleet).
    copied = (await redis.hgetall(members_key("team-b", "other", prefix)))[b"uid-2"]
    await redis.hset(members_key("team-a", "chat", prefix), mapping={
        "uid-3": encode(member(3)),
        "uid-4": seal(encode(member(4)), Scope(prefix, "team-a", "chat"), membership_key("guessed")),
        "uid-2": copied,
    })
    registry = CollectorRegistry()
    gauge = Gauge("members_ignored", "test", ["reason"], registry=registry)
    async with fake_fleet(*(member(i) for i in range(1, 5))).client() as http:
        disc = MembershipDiscovery(redis, ["team-a/chat"], http, poll_interval=60, prefix=prefix,
                                   membership_key=KEY)
        disc.show_ignored_on(gauge)
        with caplog.at_level(logging.WARNING, logger="llamafleet_router.discovery.signatures"):
            await disc.start()
            try:
                assert {s.endpoint.url for s in await disc.endpoints()} == {member(1).url}
                assert ignored_by_reason(registry) == {"unsigned": 1.0, "signature": 2.0}
                await disc.poll_once()  # the next refresh: still dropped, not logged again
                assert {s.endpoint.url for s in await disc.endpoints()} == {member(1).url}
            finally:
                await disc.stop()
    refused = [r for r in caplog.records if "signature is missing or wrong" in r.getMessage()]
    assert sorted(r.__dict__["reason"] for r in refused) == ["signature", "signature", "unsigned"]

    # Control: without a key (old installs) the same hash is read as it is, injected members too.
    async with fake_fleet(*(member(i) for i in range(1, 5))).client() as http:
        open_disc = MembershipDiscovery(redis, ["team-a/chat"], http, poll_interval=60, prefix=prefix)
        await open_disc.start()
        try:
            assert len(await open_disc.endpoints()) == 4
        finally:
            await open_disc.stop()


async def realize_pod(api: KubeEmulator, name: str, ip: str) -> None:
    """A Running, Ready pod of the fleet's Deployment at `ip` (the test plays the kubelet)."""
    deploy = await eventually(lambda: obj(api, DEPLOYMENTS, "chat"), what="deployment")
    template = deploy["spec"]["template"]
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": template["metadata"]["labels"],
                         "annotations": template["metadata"].get("annotations", {})},
            "spec": template["spec"]}
    resp = await api.post(f"/api/v1/namespaces/{NS}/pods", json=body)
    assert resp.status == 201, await resp.text()
    status = {"phase": "Running", "podIP": ip, "startTime": "2030-01-01T00:00:00Z",
              "conditions": [{"type": "Ready", "status": "True"}]}
    resp = await api.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json={"status": status},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


@pytest.mark.redis
async def test_what_the_operator_signs_the_router_reads_and_a_forged_member_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis: aioredis.Redis, redis_url: str,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    key_file = tmp_path / "membership-key"
    key_file.write_text("membership-key-of-the-test-0123456789\n")
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS], redis_url=redis_url,
                                    index_prefix=prefix, agent_token="signing-test-token",
                                    membership_key_file=key_file, reconcile_interval_s=0.3)
        async with running_operator(settings):
            await create(api, fleet_manifest("chat", replicas=1))
            await realize_pod(api, "chat-0", "10.0.0.1")

            async def written() -> list[str] | None:
                entries = await membership.read_entries(redis, NS, "chat", prefix=prefix)
                return entries or None

            [entry] = await eventually(written, what="the operator's membership entry")
        assert "sig" in json.loads(entry)
        pod = membership.decode(entry)
        # Injected next to it: the same pod moved to an address the writer chose, under another uid.
        forged = encode(Member(**{**pod.__dict__, "uid": "uid-forged", "ip": "10.0.0.66"}))
        await redis.hset(members_key(NS, "chat", prefix), "uid-forged", forged)
        router_key = RouterSettings(membership_key_file=key_file).resolved_membership_key()
        async with fake_fleet(pod, member(66, ip="10.0.0.66")).client() as http:
            disc = MembershipDiscovery(redis, [f"{NS}/chat"], http, poll_interval=60, prefix=prefix,
                                       membership_key=router_key)
            await disc.start()
            try:
                assert {s.endpoint.url for s in await disc.endpoints()} == {pod.url}
            finally:
                await disc.stop()

"""The index on a real Redis Cluster (tests/fixtures/redis_cluster.py): hash slots as Redis computes
them, one model's keys on one shard, redirects followed, membership's MULTI within one slot. The whole
index contract also runs on the Cluster (test_index_contract.py, `cluster`); failover under a gateway's
load is in tests/integration/test_gateway_failover_real.py."""

from __future__ import annotations

import socket
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from llamafleet_core.index.base import IndexUnavailable
from llamafleet_core.index.cluster import key_slot, parse_cluster_url, parse_redirect, topology
from llamafleet_core.index.redis_conn import connect, connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.index.resp_cluster import ClusterClient
from llamafleet_core.membership import Member, list_fleets, read_members, write_members
from llamafleet_core.types import SlotRef, SnapshotRef
from tests.core.test_index_contract import chain, text
from tests.fixtures.redis_cluster import BUS_OFFSET, RedisCluster, ephemeral_low

SLOT_A, SLOT_B = SlotRef("pod-a@1", 0), SlotRef("pod-b@1", 1)


def test_key_slots_are_the_ones_redis_computes(redis_cluster: RedisCluster) -> None:
    """CRC16 and the hash-tag rule, against CLUSTER KEYSLOT: tags, empty tags, unclosed braces, bytes."""
    keys = ["", "foo", "123456789", "lf:{model}:b:abc", "{}x", "{x", "a{}{b}", "x{y}z{w}", "é{ü}",
            "lf:{tiny%20dense}:slot:pod#1", "{user1000}.following"]
    node = redis_cluster.client(redis_cluster.nodes[0])
    for key in keys:
        assert key_slot(key) == int(node.execute_command("CLUSTER", "KEYSLOT", key)), key
    assert key_slot(b"lf:{m}:x") == key_slot("{m}")


@pytest.mark.parametrize(("url", "message"), [
    ("redis+cluster://", "at least one node"),
    ("redis+cluster://h:1/3", "database 0 only"),
    ("redis+cluster://h:1?db=2", "unsupported"),
    ("redis+cluster://h:1?ssl_ca_certs=/ca.pem", "need TLS"),
    ("redis+cluster://h:99999", "bad Cluster node port"),
    ("redis+clusters://h:1", "starts with"),
])
def test_bad_cluster_urls_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cluster_url(url)


def test_a_cluster_url_names_its_seeds_and_login() -> None:
    found = parse_cluster_url("rediss+cluster://bob:s%40cret@a:7000,[::1]:7001,b?ssl_cert_reqs=none")
    assert found.seeds == (("a", 7000), ("::1", 7001), ("b", 6379))
    assert (found.username, found.password, found.tls, found.tls_options) == (
        "bob", "s@cret", True, {"ssl_cert_reqs": "none"})


def test_redirects_and_slot_maps_parse_with_the_asked_node_for_empty_hosts() -> None:
    full = "MOVED 3999 10.0.0.2:6381"
    assert parse_redirect(full, ("h", 1)) == parse_redirect(full, ("x", 2))
    moved = parse_redirect("MOVED 12 :6381", ("h", 1))
    assert moved is not None and moved.moved and (moved.slot, moved.node) == (12, ("h", 6381))
    ask = parse_redirect("ASK 7 [::1]:7000", ("h", 1))
    assert ask is not None and not ask.moved and ask.node == ("::1", 7000)
    assert parse_redirect("ERR no", ("h", 1)) is None and parse_redirect("MOVED x y", ("h", 1)) is None
    found = topology([[0, 1, [b"", 7000, b"id"], [b"r", 7001, b"id2"]], [2, 16383, [b"m", 7002, b"id3"]]],
                     ("seed", 1))
    assert found.owners[0] == found.owners[1] == ("seed", 7000) and found.owners[2] == ("m", 7002)
    assert found.masters == {("seed", 7000), ("m", 7002)} and ("r", 7001) in found.nodes


def _keys_by_node(cluster: RedisCluster, prefix: str) -> dict[int, set[bytes]]:
    found: dict[int, set[bytes]] = defaultdict(set)
    for node in cluster.nodes:
        client = cluster.client(node)
        if client.info("replication")["role"] == "master":
            found[node.port].update(client.scan_iter(f"{prefix}:*"))
    return found


async def test_each_models_keys_share_one_slot_and_models_spread_over_the_shards(
        redis_cluster: RedisCluster) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = connect_index(redis_cluster.url)
    index = RedisPrefixIndex(client, prefix=prefix)
    models = [f"model-{i}" for i in range(12)]
    blocks = chain(text(4, "spread"))
    try:
        for model in models:
            await index.record_slot(model, SLOT_A, blocks, 32)
            await index.record_snapshot(model, SnapshotRef("s", "pod-a@1", 2, 16, 1), blocks[:2])
        by_node = _keys_by_node(redis_cluster, prefix)
        for model in models:
            base = f"{prefix}:{{{model}}}:".encode()
            keys = {k for ks in by_node.values() for k in ks if k.startswith(base)}
            assert len(keys) == 4 + 5 and len({key_slot(k) for k in keys}) == 1, model
        assert len([node for node, keys in by_node.items() if keys]) >= 2  # the models spread
        assert await index.purge_pod("pod-a@1") == 2 * len(models)  # across every model and shard
        assert [(await index.lookup(m, blocks)).slots for m in models] == [{}] * len(models)
    finally:
        await client.aclose()


async def test_a_lookup_is_one_script_on_one_shard(redis_cluster: RedisCluster) -> None:
    """With the slot map known, a lookup costs the cluster one EVALSHA, on the model's master alone."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = connect_index(redis_cluster.url)
    index = RedisPrefixIndex(client, prefix=prefix)
    blocks = chain(text(40, "trip"))
    masters = [redis_cluster.client(m) for m in redis_cluster.masters]

    def calls() -> list[tuple[int, int]]:
        """Per master: EVALSHA calls, and every command's (a script's own commands count too)."""
        stats = [m.info("commandstats") for m in masters]
        return [(int(s.get("cmdstat_evalsha", {}).get("calls", 0)), sum(int(v["calls"]) for v in s.values()))
                for s in stats]

    try:
        for i in range(8):
            await index.record_slot("m", SlotRef(f"pod-{i}@1", 0), blocks[: 5 * (i + 1)], 1)
        await index.lookup("m", blocks)  # loads the script on that master
        before = calls()
        found = await index.lookup("m", blocks)
        after = calls()
        assert len(found.slots) == 8
        evalsha = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
        others = [a[1] - b[1] for a, b, e in zip(after, before, evalsha, strict=True) if not e]
        assert sorted(evalsha) == [0, 0, 1]
        assert others == [1, 1]  # the other masters saw only the first INFO above
    finally:
        await client.aclose()


def _node_id(cluster: RedisCluster, port: int) -> str:
    node = next(n for n in cluster.nodes if n.port == port)
    return str(cluster.client(node).execute_command("CLUSTER", "MYID").decode())


async def test_a_client_follows_a_slot_migrated_under_it(fresh_redis_cluster: RedisCluster) -> None:
    """Mid-migration a one-key script follows ASK to the importing master, and a write whose keys are
    split between the two is refused as the index being unavailable (Redis's TRYAGAIN; the router then
    routes without the index), never half applied; after it (MOVED) the client's map learns the new
    owner and the entries are found there."""
    cluster = fresh_redis_cluster
    prefix, model = "mig", "m"
    base = f"{prefix}:{{{model}}}:"
    slot = key_slot(base)
    client = ClusterClient.from_url(cluster.url)
    index = RedisPrefixIndex(client, prefix=prefix)
    blocks = chain(text(3, "migrate"))
    try:
        await index.record_slot(model, SLOT_A, blocks, 24)
        source = cluster.master_of(base)
        target = next(m for m in cluster.masters if m is not source)
        src, dst = cluster.client(source), cluster.client(target)
        src_id, dst_id = _node_id(cluster, source.port), _node_id(cluster, target.port)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        # The base key itself never exists, so the migrating master sends every script to the target.
        assert (await index.lookup(model, blocks)).slots == {}
        with pytest.raises(IndexUnavailable, match="TRYAGAIN"):  # its pod set is still on the source
            await index.record_slot(model, SLOT_B, blocks, 24)
        for key in src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target.port, key, 0, 5000, "REPLACE")
        for master in cluster.masters:
            cluster.client(master).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        assert (await index.lookup(model, blocks)).slots == {SLOT_A: 3}  # MOVED, followed
        assert client._map is not None and client._map.owners[slot] == ("127.0.0.1", target.port)
        leases = RedisSlotLeases(client, prefix=prefix)
        assert await leases.acquire(SLOT_A, "me", 5.0) and await leases.holder(SLOT_A) == "me"
    finally:
        await client.aclose()


async def test_membership_writes_and_reads_through_redis_py_on_a_cluster(redis_cluster: RedisCluster) -> None:
    """The operator's MULTI spans the membership's keys: their hash tag keeps them in one slot."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = connect(redis_cluster.url)
    member = Member(name="p0", uid="u0", ip="10.0.0.1", port=8080, agent_port=8081, slots=4, model="m",
                    ready=True, epoch=1)
    try:
        assert await write_members(client, "ns", "fleet", [member], prefix=prefix)
        assert await read_members(client, "ns", "fleet", prefix=prefix) == [member]
        assert await list_fleets(client, prefix=prefix) == [("ns", "fleet")]
    finally:
        await client.aclose()


def test_a_real_slot_map_names_three_masters_with_a_replica_each(redis_cluster: RedisCluster) -> None:
    node = redis_cluster.nodes[0]
    found = topology(redis_cluster.client(node).execute_command("CLUSTER", "SLOTS"), ("127.0.0.1", node.port))
    assert None not in found.owners
    assert found.masters == {("127.0.0.1", m.port) for m in redis_cluster.masters}
    assert found.nodes == {("127.0.0.1", n.port) for n in redis_cluster.nodes}


def test_the_cluster_starts_on_other_ports_when_a_bus_port_is_taken(tmp_path: Path) -> None:
    """The fixture's own start: a port found free may be taken before its node binds it (a full run met
    it on a bus port), so the node starts again on other ports; all of them lie below the ephemeral
    range, where no outgoing connection can take them."""
    cluster = RedisCluster(tmp_path / "cluster")
    assert all(n.port + BUS_OFFSET < ephemeral_low() for n in cluster.nodes)
    blocked = cluster.nodes[2].port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", blocked + BUS_OFFSET))
        squatter.listen()
        cluster.start()
    try:
        assert cluster.nodes[2].port != blocked and all(n.running for n in cluster.nodes)
        assert cluster.client(cluster.nodes[2]).cluster("INFO")["cluster_state"] == "ok"
    finally:
        cluster.stop()

"""What the shared Redis holds, and under which keys:

- block hashes are keyed with the fleet's secret (`prefix_key`): whoever reads Redis and hashes a guessed
  prompt without the key finds none of the entries the gateway wrote for that very prompt (real Redis,
  real gateway); the operator's warming, with the same secret from its own settings, computes the chain
  the gateway looks up for a first turn starting with the SharedPrefix;
- so are the other hashes of prompt text: snapshot names and text hashes (in Redis, in the agents'
  folders and manifests; real pods, agents and Redis), head families' cut chains and divergence points
  (real gateway and Redis over fake pods): no stored value is an unkeyed hash of any prefix of the
  prompt, another key stores other names, and a gateway restarted with the kept key finds its snapshots;
- the gateway's Redis key prefix is a setting (`index_prefix`): a real `llamafleet router` finds its
  membership and writes its index under it; the chart gives the gateway and the operator one prefix
  (the release name unless `redis.keyPrefix`) and one prefix key (the master agent token they mount).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from hashlib import blake2b
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from pydantic import SecretStr

from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.index.redis_conn import connect_index
from llamafleet_core.index.redis_index import RedisPrefixIndex
from llamafleet_core.membership import Member, write_members
from llamafleet_core.prefix import ChatTemplate, PromptIdentity, block_chain, chat_identity, prefix_key_bytes
from llamafleet_core.types import UNKEYED, TextHasher, exact_text_hash
from llamafleet_core.warming import PrefixSource, prefix_blocks, prefix_body, render_prefix
from llamafleet_local.redis_server import free_port
from llamafleet_operator.settings import OperatorSettings
from llamafleet_router.settings import RouterSettings
from llamafleet_router.snapshots.divergence import cut_chain
from llamafleet_testbed import helm as tools
from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.chart.conftest import CHART, NAMESPACE, Helm, Manifest, one, pod_spec
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.fixtures.templates import CAPS
from tests.fuzz.fake_pod import TEMPLATE
from tests.integration.gateway_bed import chat, settled
from tests.integration.gateway_bed import gateway as bed_gateway
from tests.integration.snapshot_bed import TOKEN, agent_pod
from tests.security.first_sight_pods import PROPS as FIRST_SIGHT_PROPS
from tests.security.first_sight_pods import first_sight_pods
from tests.security.router_process import AUTH, pod_in_thread
from tests.security.tenant_bed import gateway, pod

SYSTEM = "You are the payroll assistant. Never reveal the salary table below. " * 24
BODY = {"model": "fake", "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]}
POD_PROPS = {"chat_template": TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>"}  # as the fake pod says
PROPS = {**POD_PROPS, "chat_template_caps": CAPS}
SECRET = "fleet-secret-0123456789abcdef"


def redis_text(client: redis.Redis, prefix: str) -> str:
    """Everything an index reader sees under `prefix`: key names, and every value of every key (hash
    fields and values, sorted-set and set members, list items, strings)."""
    parts: list[str] = []
    for key in client.scan_iter(f"{prefix}:*"):
        parts.append(key.decode())
        kind = client.type(key)
        values: list[bytes] = []
        if kind == b"hash":
            values = [v for kv in client.hgetall(key).items() for v in kv]
        elif kind == b"zset":
            values = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind == b"string":
            values = [client.get(key) or b""]
        parts += [v.decode(errors="replace") for v in values]
    return "\n".join(parts)


@pytest.mark.redis
async def test_index_entries_cannot_be_found_by_hashing_a_guessed_prompt_without_the_key(
    redis_url: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    client = connect_index(redis_url)
    index = RedisPrefixIndex(client, prefix=prefix)
    settings = RouterSettings(pods=["http://placeholder:1"], prefix_key=SecretStr(SECRET), poll_interval=0.2)
    try:
        async with pod() as fake:
            settings = settings.model_copy(update={"pods": [fake.url]})
            async with gateway(settings, index=index, leases=InMemorySlotLeases()) as gw, \
                    httpx.AsyncClient(base_url=gw.url) as http:
                assert (await http.post("/v1/chat/completions", json=BODY)).status_code == 200
                await gw.state.tasks.drain(10.0)
        template = ChatTemplate.from_props(POD_PROPS)
        guessed = chat_identity(BODY, template, model="fake")  # what an attacker without the key computes
        keyed = chat_identity(BODY, template, model="fake", key=settings.resolved_prefix_key())
        assert len(guessed.blocks) >= 4 and set(guessed.blocks).isdisjoint(keyed.blocks)
        assert not (await index.lookup("fake", guessed.blocks)).slots
        assert (await index.lookup("fake", keyed.blocks)).slots  # the entry is there, for the key holder
        seen = redis_text(redis.Redis.from_url(redis_url), prefix)
        assert keyed.blocks[0] in seen
        assert not [h for h in guessed.blocks if h in seen]
        assert block_chain(guessed.text, seed="fake")[0] not in seen
    finally:
        await client.aclose()


def test_warming_and_the_gateway_agree_on_the_keyed_chain_of_a_shared_prefix(tmp_path: Path) -> None:
    """The operator reads the secret from its file, the router from its own: the chain warming records
    for a SharedPrefix is the start of the chain the gateway computes for a first turn behind it."""
    secret_file = tmp_path / "token"
    secret_file.write_text(SECRET + "\n")
    operator_key = OperatorSettings(prefix_key_file=secret_file).resolved_prefix_key()
    router_key = RouterSettings(prefix_key_file=secret_file).resolved_prefix_key()
    assert operator_key == router_key == prefix_key_bytes(SECRET) and len(router_key) == 32
    source = PrefixSource(name="payroll", model="fake", messages=({"role": "system", "content": SYSTEM},))
    template = ChatTemplate.from_props(PROPS)
    text = render_prefix(source, template)
    warmed = prefix_blocks(source, text, key=operator_key)
    request = chat_identity({**prefix_body(source), "messages": [*prefix_body(source)["messages"][:-1],
                                                                  {"role": "user", "content": "what now?"}]},
                            template, model="fake", key=router_key)
    assert len(warmed) >= 4 and request.blocks[: len(warmed)] == warmed
    assert prefix_blocks(source, text) != warmed  # unkeyed: another chain altogether
    assert prefix_blocks(source, text, key=prefix_key_bytes("another fleet")) != warmed


# --- snapshot names, head families and divergence points ---------------------------------------------


def dated(day: str) -> dict[str, Any]:
    """A first turn behind SYSTEM and a date line: two days' heads part at that line's start (a few
    blocks before the head's end, so the second day's slot holds less than its head: a first sight)."""
    system = f"{SYSTEM}\n\nConversation started: {day}\n\n" + "Answer in one short sentence. " * 30
    return {**BODY, "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]}


def unkeyed_hashes(text: str) -> set[str]:
    """What a reader without the key computes of a guessed prompt to test it: the text hash of each of
    its prefixes (what names a snapshot and identifies a head or a divergence point), its cut chain and
    its block chain."""
    guesses = {exact_text_hash(text[:n]) for n in range(1, len(text) + 1)}
    return guesses | set(cut_chain(text, len(text))[1]) | set(block_chain(text, seed="fake"))


HEX = re.compile(r"(?<![0-9a-f])(?:[0-9a-f]{32}|[0-9a-f]{16})(?![0-9a-f])")


async def first_sights_in_redis(redis_url: str, secret: str) -> tuple[str, list[PromptIdentity]]:
    """Two days' first sessions of one head through a keyed gateway (snapshots on, first sight builds
    that record the head family and learn the date line's divergence point): what Redis holds after,
    and the two prompts' keyed identities."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    client = connect_index(redis_url)
    index = RedisPrefixIndex(client, prefix=prefix)
    template = ChatTemplate.from_props(FIRST_SIGHT_PROPS)
    try:
        async with first_sight_pods(1, held=False) as (_, pods):
            settings = RouterSettings(pods=pods, prefix_key=SecretStr(secret), poll_interval=0.2,
                                      agent_token=SecretStr("agent-token"), first_sight_min_chars=512)
            async with gateway(settings, index=index, leases=InMemorySlotLeases()) as gw, \
                    httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                for day in ("Monday", "Tuesday"):
                    assert (await http.post("/v1/chat/completions", json=dated(day))).status_code == 200
                    await gw.state.tasks.drain(10.0)  # the head's family record is in before the next day
                leaders = gw.state.metrics.registry.get_sample_value(
                    "llamafleet_router_snapshot_first_sight_total", {"role": "leader"})
                assert leaders == 2
        identities = [chat_identity(dated(day), template, model="fake", key=prefix_key_bytes(secret))
                      for day in ("Monday", "Tuesday")]
        return redis_text(redis.Redis.from_url(redis_url), prefix), identities
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_head_families_hold_only_keyed_hashes_and_another_key_stores_other_names(
    redis_url: str
) -> None:
    """No value in Redis equals a hash of the prompt's text, its cuts or its blocks made without the
    key; the keyed records are there (the head of each day, its cut chain); under another key every
    stored name and hash differs."""
    seen, (monday, tuesday) = await first_sights_in_redis(redis_url, SECRET)
    key = prefix_key_bytes(SECRET)
    head = tuesday.shared_chars
    assert ":fam:" in seen and TextHasher(key)(tuesday.text[:head]) in seen  # the heads were recorded
    assert TextHasher(key)(monday.text[: monday.shared_chars]) in seen
    parted = tuesday.text.index("Conversation started")  # the divergence point Tuesday's build learned
    assert TextHasher(key)(tuesday.text[:parted]) in seen
    assert set(cut_chain(tuesday.text, head, key)[1]) <= set(HEX.findall(seen))
    assert len(set(HEX.findall(seen)) & {h for h in (*monday.blocks, *tuesday.blocks)}) >= 4
    found = [h for ident in (monday, tuesday) for h in unkeyed_hashes(ident.text) if h in seen]
    assert not found, f"{len(found)} unkeyed hashes of the prompts in Redis"
    other, _ = await first_sights_in_redis(redis_url, "another fleet's secret 0123456789")
    assert ":fam:" in other and HEX.findall(other)
    assert not set(HEX.findall(seen)) & set(HEX.findall(other))


SNAPSHOT_NAME = re.compile(r"\b(?:fs|st|dv)-[0-9a-f]{32}-[0-9]+\b")


async def snapshots_of_a_first_sight(
    start: StartLlamaServer, models: TinyModels, root: Path, redis_url: str, http: httpx.AsyncClient,
    secret: str, *, restarted: bool = False,
) -> tuple[str, str, PromptIdentity]:
    """An agent session's first sight through a gateway keyed with `secret`, on a fresh real pod with its
    real agent: (what Redis holds, what the agent's snapshot folder holds: file names and manifests, the
    prompt's keyed identity). `restarted`: then a new gateway with the same key and an empty index
    (a restart), whose next session of that head must find the snapshot by its keyed name."""
    body = make_profile(WorkloadSpec(prefix_chars=6_000, seed=3)).request("tiny-dense", "hi", max_tokens=2)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    async with agent_pod(start, models.dense, "tiny-dense", root, http) as pod:
        async with bed_gateway([pod.spec], redis_url, prefix=prefix, agent_token=TOKEN,
                               prefix_key=secret) as gw:
            first = await chat(http, gw.url, body)
            await settled(gw)
        assert (first.status, first.action) == (200, "compute/first_sight"), first
        props = (await http.get(pod.server.url + "/props")).json()
        identity = chat_identity(body, ChatTemplate.from_props(props), model="tiny-dense",
                                 key=prefix_key_bytes(secret))
        seen = redis_text(redis.Redis.from_url(redis_url), prefix)
        if restarted:
            await pod.erase_slots(http)  # only the snapshot can give the head back
            async with bed_gateway([pod.spec], redis_url, prefix=f"{prefix}r", agent_token=TOKEN,
                                   prefix_key=secret) as gw:
                again = await chat(http, gw.url, {**body, "messages": [*body["messages"][:-1], {
                    "role": "user", "content": "and now?"}]})
            fs = f"fs-{identity.hasher(identity.text[: identity.shared_chars])}-{identity.shared_chars}"
            assert (again.status, again.snapshot) == (200, fs) and again.action.startswith("restore"), again
        folder = "\n".join([*(f.name for f in pod.snapshot_dir.iterdir()),
                            *(f.read_text() for f in pod.snapshot_dir.glob("*.json"))])
    return seen, folder, identity


@pytest.mark.llama
@pytest.mark.redis
async def test_snapshot_names_are_keyed_in_redis_and_on_the_agents_and_differ_per_key(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path, redis_url: str,
) -> None:
    """Real pods, agents and Redis: the first sight's snapshots are named and recorded by keyed text
    hashes only (no stored name or value is the unkeyed hash of any prefix of the prompt), a gateway
    restarted with the kept key finds them again, and another key names the same head otherwise."""
    async with httpx.AsyncClient(timeout=300) as http:
        seen, folder, identity = await snapshots_of_a_first_sight(
            start_llama_server, tiny_models, tmp_path / "a", redis_url, http, SECRET, restarted=True)
        other_seen, other_folder, _ = await snapshots_of_a_first_sight(
            start_llama_server, tiny_models, tmp_path / "b", redis_url, http, "another fleet's secret 0123")
    head = identity.shared_chars
    names = set(SNAPSHOT_NAME.findall(seen))
    assert f"fs-{identity.hasher(identity.text[:head])}-{head}" in names, names  # the head, keyed
    assert len(names) >= 2 and names == set(SNAPSHOT_NAME.findall(folder)), (names, folder)  # with stages
    guesses = unkeyed_hashes(identity.text)
    assert not [h for h in guesses if h in seen], "an unkeyed hash of the prompt in Redis"
    assert not [h for h in guesses if h in folder], "an unkeyed hash of the prompt in the snapshot folder"
    other = set(SNAPSHOT_NAME.findall(other_seen))
    assert other and not names & other and not set(HEX.findall(seen)) & set(HEX.findall(other_seen))
    assert not names & set(SNAPSHOT_NAME.findall(other_folder))


def test_text_hashes_are_keyed_deterministic_and_per_tenant() -> None:
    """One key gives one hash whatever computes it (gateway replicas, a restart with the kept key,
    warming); another key or another tenant group another; no key: the unkeyed hash, as before."""
    text = f"{SYSTEM}\n\nConversation started: Monday"
    key = prefix_key_bytes(SECRET)
    assert TextHasher(key)(text) == TextHasher(prefix_key_bytes(SECRET))(text) == exact_text_hash(text, key)
    hashes = {exact_text_hash(text), TextHasher(key)(text), TextHasher(prefix_key_bytes("other"))(text),
              TextHasher(key, "a")(text), TextHasher(key, "b")(text), TextHasher(b"", "a")(text)}
    assert len(hashes) == 6
    assert UNKEYED(text) == exact_text_hash(text) == blake2b(text.encode(), digest_size=16).hexdigest()
    assert cut_chain(text, len(text), key) != cut_chain(text, len(text)) == cut_chain(text, len(text), b"")
    assert "fleet-secret" not in repr(TextHasher(key)) and key.hex() not in repr(TextHasher(key))


# --- the Redis key prefix ------------------------------------------------------------------------------


@contextlib.contextmanager
def membership_router(redis_url: str, tmp_path: Path, **env: str) -> Iterator[str]:
    """`llamafleet router --discovery redis` on a free port, once its /health answers 200."""
    port = free_port()
    variables = {**os.environ, "LLAMAFLEET_ROUTER_API_KEYS": f"security:{AUTH['Authorization'][7:]}",
                 "LLAMAFLEET_ROUTER_POLL_INTERVAL": "0.2", "LLAMAFLEET_ROUTER_MEMBER_NETWORKS": "127.0.0.0/8",
                 **{f"LLAMAFLEET_ROUTER_{k.upper()}": v for k, v in env.items()}}
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llamafleet_cli.cli", "router", "--discovery", "redis",
             "--redis", redis_url, "--host", "127.0.0.1", "--port", str(port)],
            env=variables, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"the router exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the router did not get ready: {log.read_text()[-2000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_a_real_router_reads_membership_and_writes_its_index_under_its_prefix(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    with pod_in_thread() as fake:
        port = int(urlsplit(fake.url).port or 0)
        member = Member(name="p0", uid="u0", ip="127.0.0.1", port=port, agent_port=port, slots=2,
                        model="fake", ready=True, epoch=1)
        await write_members(aredis, "team", "tiny", [member], prefix=prefix)
        with membership_router(redis_url, tmp_path, index_prefix=prefix) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                assert (await http.post("/v1/chat/completions", json=BODY, headers=AUTH)).status_code == 200
            written = [k.decode() async for k in aredis.scan_iter(f"{prefix}:*")]
    assert [k for k in written if ":b:" in k], written  # the request's blocks, under the prefix
    assert [k for k in written if ":lease:" in k or ":slot:" in k], written


@pytest.fixture(scope="module")
def helm() -> Iterator[Helm]:
    yield Helm(tools.helm())


def env_of(objs: list[Manifest], component: str) -> dict[str, Any]:
    container = pod_spec(one(objs, "Deployment", component))["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def mounts_of(objs: list[Manifest], component: str) -> set[str]:
    container = pod_spec(one(objs, "Deployment", component))["containers"][0]
    return {m["mountPath"] for m in container["volumeMounts"]}


@pytest.mark.parametrize(("release", "sets", "want"), [
    ("prod", (), "prod"), ("prod", ("redis.keyPrefix=team-a",), "team-a")])
def test_chart_gives_gateway_and_operator_one_prefix_and_one_prefix_key(
    helm: Helm, monkeypatch: pytest.MonkeyPatch, release: str, sets: tuple[str, ...], want: str
) -> None:
    args = ["template", release, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    objs = helm.render(*args)
    router, operator = env_of(objs, "gateway"), env_of(objs, "operator")
    assert router["LLAMAFLEET_ROUTER_INDEX_PREFIX"] == operator["LLAMAFLEET_OPERATOR_INDEX_PREFIX"] == want
    key_file = router["LLAMAFLEET_ROUTER_PREFIX_KEY_FILE"]
    assert key_file == operator["LLAMAFLEET_OPERATOR_PREFIX_KEY_FILE"]
    assert str(Path(key_file).parent) in mounts_of(objs, "gateway") & mounts_of(objs, "operator")
    for name, value in {**router, **operator}.items():
        if name.endswith("INDEX_PREFIX"):
            monkeypatch.setenv(name, value)
    assert RouterSettings().index_prefix == OperatorSettings().index_prefix == want

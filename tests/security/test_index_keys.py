"""What the shared Redis holds, and under which keys:

- block hashes are keyed with the fleet's secret (`prefix_key`): whoever reads Redis and hashes a guessed
  prompt without the key finds none of the entries the gateway wrote for that very prompt (real Redis,
  real gateway); the operator's warming, with the same secret from its own settings, computes the chain
  the gateway looks up for a first turn starting with the SharedPrefix;
- the gateway's Redis key prefix is a setting (`index_prefix`): a real `llamafleet router` finds its
  membership and writes its index under it; the chart gives the gateway and the operator one prefix
  (the release name unless `redis.keyPrefix`) and one prefix key (the master agent token they mount).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from pydantic import SecretStr

from llamafleet_core.index.memory import InMemorySlotLeases
from llamafleet_core.index.redis_index import RedisPrefixIndex, connect_index
from llamafleet_core.membership import Member, write_members
from llamafleet_core.prefix import ChatTemplate, block_chain, chat_identity, prefix_key_bytes
from llamafleet_core.warming import PrefixSource, prefix_blocks, prefix_body, render_prefix
from llamafleet_local import helm as tools
from llamafleet_local.redis_server import free_port
from llamafleet_operator.settings import OperatorSettings
from llamafleet_router.settings import RouterSettings
from tests.chart.conftest import CHART, NAMESPACE, Helm, Manifest, one, pod_spec
from tests.fixtures.templates import CAPS
from tests.fuzz.fake_pod import TEMPLATE
from tests.security.router_process import AUTH, pod_in_thread
from tests.security.tenant_bed import gateway, pod

SYSTEM = "You are the payroll assistant. Never reveal the salary table below. " * 24
BODY = {"model": "fake", "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]}
POD_PROPS = {"chat_template": TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>"}  # as the fake pod says
PROPS = {**POD_PROPS, "chat_template_caps": CAPS}
SECRET = "fleet-secret-0123456789abcdef"


def redis_text(client: redis.Redis, prefix: str) -> str:
    """Everything an index reader sees under `prefix`: key names, and the fields and values of hashes."""
    parts: list[str] = []
    for key in client.scan_iter(f"{prefix}:*"):
        parts.append(key.decode())
        if client.type(key) == b"hash":
            parts += [v.decode(errors="replace") for kv in client.hgetall(key).items() for v in kv]
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
            [sys.executable, "-m", "llamafleet_local.cli", "router", "--discovery", "redis",
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

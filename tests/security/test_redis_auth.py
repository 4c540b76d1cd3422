"""Finding 6 (Redis authentication): the bundled Redis requires a password, optionally over TLS, and
every client passes it.

Before the fix the chart's Redis had neither password nor TLS: whoever reached it wrote the membership
(where prompts go) and the index. Now:

- the chart generates a password into a Secret (or takes `existingSecret`), Redis requires it, and the
  gateway's and the operator's URL take it from that Secret through the environment: it is in no
  ConfigMap, no argument and no literal of any rendered object; with `redis.tls` the URL is rediss://;
- the clients (the index's own RESP client, redis-py for membership) work with the password and fail
  clearly without it or with a wrong one, against a real redis-server started with `requirepass`;
- rediss:// works end to end through a TLS endpoint (a self-signed certificate made for the test) and
  is refused with a CA that did not sign it. The redis-server here is built without TLS, so TLS is
  terminated by a small proxy in front of it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.exceptions import AuthenticationError, ResponseError

from llamafleet_core.index.redis_conn import connect, connect_index
from llamafleet_core.index.redis_leases import RedisSlotLeases
from llamafleet_core.index.resp import RespError, redacted_url
from llamafleet_core.membership import Member, read_members, write_members
from llamafleet_core.types import SlotRef
from llamafleet_local.redis_server import RedisServer, free_port
from llamafleet_testbed import helm

ROOT = Path(__file__).parents[2]
PASSWORD = "p4ss-" + uuid.uuid4().hex

pytestmark = pytest.mark.redis


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        yield server
    finally:
        server.stop()


def without_password(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


def member() -> Member:
    return Member(name="p", uid="uid-p", ip="10.0.0.5", port=8080, agent_port=8090, slots=2, model="m",
                  ready=True, epoch=1)


# --- real redis-server with requirepass ----------------------------------------------------------------

def test_the_password_is_not_on_the_servers_command_line(guarded: RedisServer) -> None:
    assert guarded.proc is not None
    assert PASSWORD not in " ".join(guarded.proc.args)  # type: ignore[arg-type]
    assert redacted_url(guarded.url) == f"redis://:***@127.0.0.1:{guarded.port}/0"


async def test_the_index_client_works_with_the_password_and_fails_clearly_without(
        guarded: RedisServer) -> None:
    client = connect_index(guarded.url, timeout_s=2.0)
    leases = RedisSlotLeases(client)
    try:
        assert await leases.ping()
        assert await leases.acquire(SlotRef("uid-p", 0), "replica-a", 5.0)
        assert await leases.holder(SlotRef("uid-p", 0)) == "replica-a"
    finally:
        await client.aclose()

    anonymous = connect_index(without_password(guarded), timeout_s=2.0)
    try:
        with pytest.raises(RespError, match="NOAUTH"):
            await anonymous.execute("GET", "anything")
    finally:
        await anonymous.aclose()
    wrong = connect_index(f"redis://:wrong@127.0.0.1:{guarded.port}/0", timeout_s=2.0)
    try:
        with pytest.raises(ConnectionError, match=r"WRONGPASS|invalid password"):
            await wrong.execute("PING")
    finally:
        await wrong.aclose()


async def test_membership_works_with_the_password_and_fails_clearly_without(
        guarded: RedisServer) -> None:
    client = connect(guarded.url, timeout_s=2.0)
    try:
        await write_members(client, "team", "f", [member()])
        assert [m.uid for m in await read_members(client, "team", "f")] == ["uid-p"]
    finally:
        await client.aclose()
    anonymous = connect(without_password(guarded), timeout_s=2.0)
    try:
        with pytest.raises((AuthenticationError, ResponseError), match=r"(?i)auth"):
            await write_members(anonymous, "team", "f", [])
    finally:
        await anonymous.aclose()


# --- rediss:// through a TLS endpoint --------------------------------------------------------------------

def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 (openssl), as (cert, key)."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@contextlib.asynccontextmanager
async def tls_endpoint(upstream: int, cert: Path, key: Path) -> AsyncIterator[int]:
    """TLS on a free port, relayed byte for byte to the plain Redis on `upstream`."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    port = free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port, ssl=ctx)
    try:
        yield port
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make a test certificate")
async def test_rediss_urls_work_through_tls_and_refuse_a_foreign_ca(
        guarded: RedisServer, tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, "redis")
    other, _ = _certificate(tmp_path, "other")
    async with tls_endpoint(guarded.port, cert, key) as port:
        url = f"rediss://:{PASSWORD}@localhost:{port}/0?ssl_ca_certs={cert}"
        index = connect_index(url, timeout_s=5.0)
        try:
            assert await index.ping()
        finally:
            await index.aclose()
        client = connect(url, timeout_s=5.0)
        try:
            await write_members(client, "team", "tls", [member()])
            assert len(await read_members(client, "team", "tls")) == 1
        finally:
            await client.aclose()

        foreign = f"rediss://:{PASSWORD}@localhost:{port}/0?ssl_ca_certs={other}"
        index = connect_index(foreign, timeout_s=5.0)
        try:
            with pytest.raises(ConnectionError, match=r"(?i)certificate"):
                await index.ping()
        finally:
            await index.aclose()
        client = connect(foreign, timeout_s=5.0)
        try:
            with pytest.raises(Exception, match=r"(?i)certificate"):
                await client.ping()
        finally:
            await client.aclose()


# --- the chart ------------------------------------------------------------------------------------------

def render(*sets: str) -> list[dict[str, Any]]:
    chart = ROOT / "charts" / "llamafleet"
    argv = [str(helm.helm()), "template", "lf", str(chart), "--namespace", "llamafleet"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def containers(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    return {f"{o['metadata']['name']}/{c['name']}": c
            for o in workloads for c in o["spec"]["template"]["spec"]["containers"]}


def test_the_chart_gives_redis_a_password_that_only_secrets_hold() -> None:
    objs = render()
    (secret,) = [o for o in objs
                 if o["kind"] == "Secret" and o["metadata"]["name"] == "lf-llamafleet-redis-auth"]
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert len(password) == 40 and password.isalnum()
    everything_else = yaml.safe_dump([o for o in objs if o is not secret])
    assert password not in everything_else, "the password may live in its Secret only"

    cs = containers(objs)
    redis = cs["lf-llamafleet-redis/redis"]
    env = {e["name"]: e for e in redis["env"]}
    ref = {"name": "lf-llamafleet-redis-auth", "key": "password"}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
    assert env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == ref  # the readiness probe's redis-cli
    assert redis["args"][redis["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    for name, var in (("lf-llamafleet-gateway/gateway", "LLAMAFLEET_ROUTER_REDIS_URL"),
                      ("lf-llamafleet-operator/operator", "LLAMAFLEET_OPERATOR_REDIS_URL")):
        names = [e["name"] for e in cs[name]["env"]]
        # Defined before the URL that refers to it: the kubelet expands only earlier variables.
        assert names.index("LLAMAFLEET_REDIS_PASSWORD") < names.index(var)
        env = {e["name"]: e for e in cs[name]["env"]}
        assert env["LLAMAFLEET_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == ref
        assert env[var]["value"].startswith("redis://:$(LLAMAFLEET_REDIS_PASSWORD)@lf-llamafleet-redis.")


def test_the_chart_takes_an_existing_password_and_serves_tls_when_asked() -> None:
    objs = render("redis.auth.existingSecret=my-redis", "redis.tls.enabled=true",
                  "redis.tls.existingSecret=redis-tls")
    assert not [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("redis-auth")]
    cs = containers(objs)
    redis = cs["lf-llamafleet-redis/redis"]
    env = {e["name"]: e for e in redis["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"
    args = redis["args"]
    assert args[args.index("--port") + 1] == "0" and args[args.index("--tls-port") + 1] == "6379"
    gateway = cs["lf-llamafleet-gateway/gateway"]
    url = {e["name"]: e for e in gateway["env"]}["LLAMAFLEET_ROUTER_REDIS_URL"]["value"]
    assert url.startswith("rediss://:$(LLAMAFLEET_REDIS_PASSWORD)@") and "ssl_ca_certs=" in url
    ca = url.split("ssl_ca_certs=", 1)[1]
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    assert ca == f"{mounts['redis-tls']}/ca.crt"

"""The index's own Redis client (`resp.py`) against a real redis-server: pipelining, errors, scripts,
outages, stalls, cancellation and URLs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llamafleet_core.index.resp import Address, LuaScript, RespClient, RespError, pack
from llamafleet_local.redis_server import RedisServer

pytestmark = pytest.mark.redis

ECHO_ARG = LuaScript("return ARGV[1] .. ':' .. KEYS[1]")


@pytest.fixture
async def rc(redis_url: str) -> AsyncIterator[RespClient]:
    c = RespClient.from_url(redis_url, timeout_s=5.0)
    try:
        yield c
    finally:
        await c.aclose()


async def test_concurrent_commands_on_one_connection_each_get_their_own_reply(rc: RespClient) -> None:
    replies = await asyncio.gather(*(rc.execute("ECHO", f"v{i}" * (1 + i % 50)) for i in range(300)))
    assert replies == [f"v{i}".encode() * (1 + i % 50) for i in range(300)]


async def test_error_reply_raises_and_leaves_the_connection_usable(rc: RespClient) -> None:
    with pytest.raises(RespError, match="unknown command"):
        await rc.execute("NOSUCHCOMMAND", "x")
    assert await rc.execute("ECHO", "after") == b"after"


async def test_script_runs_again_after_the_server_lost_its_script_cache(rc: RespClient) -> None:
    assert await rc.run_script(ECHO_ARG, ["k"], ["a"]) == b"a:k"
    await rc.execute("SCRIPT", "FLUSH")
    assert await rc.execute("SCRIPT", "EXISTS", ECHO_ARG.sha) == [0]
    assert await rc.run_script(ECHO_ARG, ["k2"], ["b"]) == b"b:k2"  # NOSCRIPT, then EVAL
    assert await rc.execute("SCRIPT", "EXISTS", ECHO_ARG.sha) == [1]
    with pytest.raises(RespError):
        await rc.run_script(LuaScript("return redis.call('NOSUCH')"))


async def test_a_cancelled_caller_does_not_shift_later_replies(rc: RespClient) -> None:
    slow = asyncio.create_task(rc.run_script(LuaScript(
        "local t = redis.call('TIME'); local s = t[1] * 1e6 + t[2] "
        "while true do t = redis.call('TIME'); if t[1] * 1e6 + t[2] - s > 150000 then break end end "
        "return 'slow'")))
    await asyncio.sleep(0.02)
    slow.cancel()
    later = [rc.execute("ECHO", f"after{i}") for i in range(5)]
    assert await asyncio.gather(*later) == [f"after{i}".encode() for i in range(5)]


async def test_outage_fails_fast_then_the_same_client_reconnects(redis_server: RedisServer) -> None:
    rc = RespClient.from_url(redis_server.url, timeout_s=0.5, redial_s=0.3)
    dials = 0
    dial = rc._dial

    async def counting_dial() -> Any:
        nonlocal dials
        dials += 1
        return await dial()

    rc._dial = counting_dial  # type: ignore[method-assign]
    try:
        assert await rc.execute("SET", "k", "1") == b"OK"
        redis_server.stop()
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            await rc.execute("GET", "k")  # the connection dies under it or the redial is refused
        for _ in range(20):  # within redial_s: no new dial per command
            with pytest.raises(ConnectionError):
                await rc.execute("GET", "k")
        assert time.monotonic() - started < 0.3
        assert dials <= 2
        redis_server.start()
        await asyncio.sleep(0.35)
        assert await rc.execute("GET", "k") is None  # a fresh server, no persistence
    finally:
        await rc.aclose()


async def test_a_stalled_server_times_out_and_the_client_recovers(redis_server: RedisServer) -> None:
    rc = RespClient.from_url(redis_server.url, timeout_s=0.3)
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    try:
        assert await rc.ping()
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            results = await asyncio.gather(*(rc.execute("ECHO", str(i)) for i in range(3)),
                                           return_exceptions=True)
            assert all(isinstance(r, TimeoutError | ConnectionError) for r in results), results
            assert time.monotonic() - started < 1.0
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await rc.execute("ECHO", "back") == b"back"  # a new connection, nothing shifted
    finally:
        await rc.aclose()


async def test_a_command_its_caller_gave_up_on_still_closes_a_stalled_connection(
    redis_server: RedisServer,
) -> None:
    """The caller's own deadline (the index's op timeout) may come first: the connection's watchdog
    still closes the stalled connection at the command's deadline, failing what queued behind it, and
    the next command dials anew. Commands answered in time leave no timer behind them."""
    rc = RespClient.from_url(redis_server.url, timeout_s=0.3)
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    try:
        for i in range(50):
            assert await rc.execute("ECHO", str(i)) == str(i).encode()
        conn = rc._conn
        assert conn is not None and not conn._deadlines  # every reply took its deadline with it
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await rc.execute("ECHO", "given up")
            queued = asyncio.ensure_future(rc.execute("ECHO", "queued"))
            with pytest.raises(TimeoutError, match="did not answer"):
                await queued  # failed by the watchdog, at the first command's deadline
            assert conn.closed
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await rc.execute("ECHO", "back") == b"back"
        assert rc._conn is not conn
    finally:
        await rc.aclose()


async def test_password_and_database_from_the_url_are_used(redis_server: RedisServer) -> None:
    admin = RespClient.from_url(redis_server.url)
    try:
        await admin.execute("CONFIG", "SET", "requirepass", "s3cret")
        await admin.execute("AUTH", "s3cret")
        port = redis_server.port
        db3 = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{port}/3")
        db0 = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{port}")
        wrong = RespClient.from_url(f"redis://:nope@127.0.0.1:{port}/0")
        try:
            await db3.execute("SET", "where", "three")
            assert await db0.execute("GET", "where") is None
            assert await db3.execute("GET", "where") == b"three"
            with pytest.raises(ConnectionError, match="AUTH"):
                await wrong.execute("PING")
        finally:
            for c in (db3, db0, wrong):
                await c.aclose()
    finally:
        await admin.aclose()


def test_urls_parse_or_fail_with_the_field_named() -> None:
    a = Address.from_url("redis://user:p%40ss@cache.example:6380/2")
    assert (a.host, a.port, a.db, a.username, a.password) == ("cache.example", 6380, 2, "user", "p@ss")
    assert a.tls is None
    assert Address.from_url("redis://h?db=4").db == 4
    assert Address.from_url("unix:///run/redis.sock?db=1").path == "/run/redis.sock"
    assert Address.from_url("rediss://h:6390?ssl_cert_reqs=none").tls is not None
    for bad, message in [
        ("http://h:6379", "scheme"),
        ("redis://h:6379/0?socket_timeout=3", "socket_timeout"),
        ("redis://h:6379/zero", "bad Redis URL"),
        ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("unix://", "socket path"),
    ]:
        with pytest.raises(ValueError, match=message):
            Address.from_url(bad)


def test_bad_url_errors_never_show_the_password() -> None:
    with pytest.raises(ValueError) as err:
        Address.from_url("redis://:hunter2@h:6379/zero")
    assert "hunter2" not in str(err.value)


def test_commands_are_packed_as_resp_bulk_strings() -> None:
    assert pack(["SET", b"k\r\n", 7, 1.5]) == b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n7\r\n$3\r\n1.5\r\n"
    with pytest.raises(TypeError):
        pack(["SET", True])


def test_works_on_uvloop_the_router_s_event_loop(redis_url: str) -> None:
    """uvloop's transports are not `asyncio.Transport` subclasses; the router runs on uvloop."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> list[Any]:
        rc = RespClient.from_url(redis_url)
        try:
            return [await rc.ping(), *await asyncio.gather(*(rc.execute("ECHO", str(i)) for i in range(50)))]
        finally:
            await rc.aclose()

    assert uvloop.run(main()) == [True, *(str(i).encode() for i in range(50))]

"""Hand-written hostile inputs the generators rarely reach: huge bodies, deeply nested JSON, invalid
UTF-8, lone surrogates, slow clients and a client that stops reading its stream. Every one gets a 4xx
or a normal answer, never a 5xx, the gateway keeps serving others meanwhile, and nothing stays in flight
or leased afterwards."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fuzz.fake_pod import Stream
from tests.fuzz.served import AUTH, Served, served_gateway

LIMIT = 256 * 1024
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway(max_body_bytes=LIMIT) as s:
        yield s


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=15.0) as client:
        yield client
    assert served.leaks() == (0, 0), "a request is still counted in flight or holds a slot lease"


def _chat(content: object) -> dict[str, object]:
    return {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def test_body_over_the_limit_gets_413_when_declared_or_chunked(http: httpx.Client) -> None:
    """413 by Content-Length, and by counting when the body is chunked (no Content-Length)."""
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * LIMIT + b'"}]}'
    assert http.post(CHAT, content=big, headers={"content-type": "application/json"}).status_code == 413

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 16 * 1024):
            yield big[i:i + 16 * 1024]

    assert http.post(CHAT, content=chunks()).status_code == 413


def test_a_lying_content_length_gets_a_4xx(served: Served) -> None:
    """Not a number, negative, or larger than what follows (the connection then closes): never a 5xx."""
    for value in (b"not-a-number", b"-5", b"10 10"):
        assert 400 <= _raw(served, CHAT, b"{}", {b"content-length": value}) < 500, value


def _raw(served: Served, path: str, body: bytes, headers: dict[bytes, bytes]) -> int:
    """One HTTP/1.1 request written byte for byte (clients refuse to send malformed ones); its status."""
    split = urlsplit(served.url)
    head = {b"host": b"x", b"connection": b"close", b"content-type": b"application/json",
            b"authorization": AUTH["Authorization"].encode(), b"content-length": str(len(body)).encode(),
            **headers}
    raw = b"POST " + path.encode() + b" HTTP/1.1\r\n" + b"".join(
        k + b": " + v + b"\r\n" for k, v in head.items()) + b"\r\n" + body
    with socket.create_connection((split.hostname or "", split.port or 0), timeout=10) as sock:
        sock.sendall(raw)
        answer = sock.recv(65536)
    return int(answer.split(b" ", 2)[1])


def test_body_just_under_the_limit_is_served(http: httpx.Client) -> None:
    """The limit is not off by one the wrong way: a body of LIMIT - 100 bytes is answered."""
    pad = LIMIT - 100 - len(b'{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":""}]}')
    resp = http.post(CHAT, json=_chat("y" * pad))
    assert resp.status_code == 200, resp.text[:300]


@pytest.mark.parametrize("depth", [64, 1000, 100_000])
def test_deeply_nested_json_gets_400_or_an_answer_when_anywhere_in_the_body(
    http: httpx.Client, depth: int,
) -> None:
    """Nesting at the top level (beyond the parser's recursion limit) and inside message content."""
    top = b"[" * depth + b"]" * depth
    assert http.post(CHAT, content=top, headers={"content-type": "application/json"}).status_code == 400
    inner = "[" * depth + "]" * depth
    raw = ('{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":' + inner + "}]}").encode()
    resp = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code < 500, resp.text[:300]
    tools = ('{"model":"fake","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
             '"function":{"name":"f","parameters":' + '{"a":' * depth + "1" + "}" * depth + "}}]}").encode()
    resp = http.post(CHAT, content=tools, headers={"content-type": "application/json"})
    assert resp.status_code < 500, resp.text[:300]


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "\xff\xfe broken"}]}',
    b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}',
    b"\xef\xbb\xbf" + b'{"messages": [{"role": "user", "content": "bom"}]}',
    b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00 a valid pair"}]}',
    b'{"messages": [{"role": "user", "content": "\\ud800 lone high"}]}',
    b'{"messages": [{"role": "user", "content": "\\udc00\\ud800 reversed"}]}',
    b'{"prompt": "\\udfff"}',
    b"\x00\x00\x00{",
])
def test_invalid_utf8_and_lone_surrogates_never_get_a_5xx(http: httpx.Client, raw: bytes) -> None:
    """Bytes that are not UTF-8, a BOM, and JSON escapes of lone surrogates (valid JSON, not encodable
    as UTF-8 when forwarded): a 4xx or an answer."""
    path = "/v1/completions" if b"prompt" in raw else CHAT
    resp = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])


def test_hostile_headers_never_get_a_5xx(served: Served, http: httpx.Client) -> None:
    """Non-ASCII and oversized request ids, an absurd Accept, bearer tokens with odd bytes."""
    body = b'{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}'
    for headers in ({b"x-request-id": "é".encode() * 10}, {b"x-request-id": b"\xff\xfe" * 50},
                    {b"x-request-id": b"a" * 10_000}, {b"accept": b"\x7f" * 100},
                    {b"authorization": b"Bearer \xff\x01"}, {b"authorization": b"Basic Zm9vOmJhcg=="},
                    {b"x-api-key": b" " * 50}, {b"content-type": b"text/plain; charset=\xff"}):
        status = _raw(served, CHAT, body, headers)
        assert status < 500, (headers, status)


def test_slow_clients_do_not_stop_others_from_being_served(served: Served, http: httpx.Client) -> None:
    """Twenty slowloris connections (headers and a body trickled a byte at a time, never finished within
    the test) while normal requests keep getting answers in well under a second each."""
    host, port = urlsplit(served.url).hostname or "", urlsplit(served.url).port or 0
    stop = threading.Event()
    request = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH['Authorization']}\r\n"
               "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"messages\": [").encode()

    def trickle() -> None:
        with socket.create_connection((host, port), timeout=5) as sock:
            for byte in request:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.01)
            stop.wait(10)

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(20)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        for _ in range(10):
            started = time.monotonic()
            resp = http.post(CHAT, json=_chat("still there?"))
            assert resp.status_code == 200 and time.monotonic() - started < 1.0
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)


def _until(check: Callable[[], bool], limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stalled(stream: Stream, quiet: float = 0.3, limit: float = 10.0) -> bool:
    """Whether the stream stops making progress (no event taken for `quiet` seconds) before it ends."""
    deadline = time.monotonic() + limit
    while not stream.ended and time.monotonic() < deadline:
        sent = stream.sent
        time.sleep(quiet)
        if stream.sent == sent:
            return not stream.ended
    return False


def test_a_stream_nobody_reads_holds_its_slot_only_and_is_stopped_when_it_closes(
    served: Served, http: httpx.Client,
) -> None:
    """A client opens a 20 MB stream with a tiny receive buffer, reads its status line and nothing more.
    Backpressure stalls the relay and the pod's generation (the gateway does not buffer the stream
    without bound); meanwhile the stream holds one request and one slot, and others are answered at
    once. When the client closes, the gateway stops the generation and gives the slot back."""
    split = urlsplit(served.url)
    body = json.dumps({**_chat("a long answer, please"), "stream": True, "fake_events": 5000}).encode()
    request = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH['Authorization']}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    before = len(served.streams)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.settimeout(10)
    try:
        sock.connect((split.hostname or "", split.port or 0))
        sock.sendall(request)
        assert sock.recv(16).startswith(b"HTTP/1.1 200"), "the stream did not start"
        assert _until(lambda: len(served.streams) > before, 5.0)
        stream = served.streams[before]
        assert _stalled(stream), f"never stalled: {stream}"
        assert stream.sent < stream.total
        assert served.on_loop(lambda: served.app.state.gateway.in_flight.total()) == 1
        for i in range(10):
            started = time.monotonic()
            resp = http.post(CHAT, json={**_chat(f"meanwhile {i}"), "stream": i % 2 == 0})
            assert resp.status_code == 200, resp.text[:300]
            assert time.monotonic() - started < 1.0
        assert not stream.ended, "the stream was not held while the others were served"
    finally:
        sock.close()
    assert _until(lambda: stream.ended, 5.0), "the generation goes on after the client left"
    assert stream.sent < stream.total
    assert served.leaks() == (0, 0)

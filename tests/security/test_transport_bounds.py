"""What a client, or a pod, can make a gateway replica hold, and for how long:

- a pod's non-streamed answer is read up to `max_response_bytes` and no further (a real `llamafleet
  router` process: its peak RSS stays flat for a 256 MiB answer, which gets a clean 502);
- a request's head is bounded in size before authentication (431, never forwarded; on the real process,
  whose command line sets the transport up) and in time (a head trickled or never sent: cut at
  `header_timeout_s`);
- a body trickled slower than `body_timeout_s` gets 408;
- a client that leaves mid-upload is an INFO line and a counted disconnect, not an unhandled error.

Raw sockets: clients refuse to send what these tests send. Every wait is on the socket (an answer, the
close) with a deadline, never a sleep.
"""

from __future__ import annotations

import logging
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fuzz.fake_pod import Hit
from tests.fuzz.served import AUTH, Served, served_gateway
from tests.security import router_process as rp

CHAT = "/v1/chat/completions"
BODY = b'{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}'
MIB = 1024 * 1024
HEAD_TIMEOUT = 0.5
BODY_TIMEOUT = 0.5
RESPONSE_LIMIT = MIB


def forwarded(hits: list[Hit]) -> list[Hit]:
    return [h for h in hits if not h.background]


def address(url: str) -> tuple[str, int]:
    split = urlsplit(url)
    return split.hostname or "", split.port or 0


def head(headers: dict[str, str | bytes], length: int = len(BODY)) -> bytes:
    fields = {"host": "x", "content-type": "application/json", "content-length": str(length),
              "connection": "close", "authorization": AUTH["Authorization"], **headers}
    return (f"POST {CHAT} HTTP/1.1\r\n".encode()
            + b"".join(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()) + b"\r\n"
                       for k, v in fields.items()) + b"\r\n")


def exchange(url: str, raw: bytes, limit: float = 15.0) -> tuple[bytes, bool]:
    """Send `raw`, read until the server closes: (what it answered, whether the connection was reset).
    A server that refuses a request midway may close before it has read it all: then sending fails or
    the close is a reset, and the answer may be lost with it."""
    answer, reset = b"", False
    with socket.create_connection(address(url), timeout=limit) as sock:
        try:
            sock.sendall(raw)
        except OSError:
            reset = True
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            reset = True
    return answer, reset


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def trickle_until_answered(sock: socket.socket, pieces: Iterator[bytes], limit: float) -> float:
    """Send a piece whenever the server has said nothing for 0.1 s, until it answers or closes; the
    seconds that took (the test fails past `limit`)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            return time.monotonic() - started
        try:
            sock.sendall(next(pieces))
        except OSError:  # closed under our feet: that is an answer too
            return time.monotonic() - started
    pytest.fail(f"the server still waited after {limit} s")


def read_to_close(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def until(check: Callable[[], bool], limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def forever(piece: bytes) -> Iterator[bytes]:
    while True:
        yield piece


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway(header_timeout_s=HEAD_TIMEOUT, body_timeout_s=BODY_TIMEOUT,
                        max_response_bytes=RESPONSE_LIMIT) as s:
        yield s


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=15.0) as client:
        yield client
    assert served.leaks() == (0, 0), "a request is still counted in flight or holds a slot lease"


# --- answers (finding 4) ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the router's peak RSS from /proc")
def test_a_huge_answer_gets_502_and_the_router_never_holds_it(tmp_path: Path) -> None:
    """A pod answers 256 MiB unstreamed (an `n_probs` answer can be that large): the router process
    answers a clean 502 at its default limit (16 MiB) and its peak RSS grows by far less than the
    answer; the pod was stopped long before its end."""
    with rp.pod_in_thread() as pod, rp.router_process(pod.url, tmp_path) as router:
        with httpx.Client(base_url=router.url, headers=rp.AUTH, timeout=120) as client:
            assert client.post(CHAT, content=BODY).status_code == 200  # warm: what a request allocates
            before = router.status("VmHWM")
            body = BODY[:-1] + b',"fake_bytes":' + str(256 * MIB).encode() + b"}"
            resp = client.post(CHAT, content=body)
            grown_mib = (router.status("VmHWM") - before) / 1024
        assert resp.status_code == 502, resp.text[:300]
        error = resp.json()["error"]
        assert error["code"] == "upstream_answer_too_large" and error["type"] == "server_error"
        assert grown_mib < 96, f"peak RSS grew by {grown_mib:.0f} MiB for a 256 MiB answer"
        stream = pod.streams[-1]
        assert until(lambda: stream.ended), "the pod is still sending the answer"
        assert stream.sent * 64 * 1024 < 64 * MIB, f"the pod sent {stream.sent} pieces"


def test_an_answer_over_the_limit_is_given_up_by_its_length_or_by_counting(
    served: Served, http: httpx.Client
) -> None:
    """Declared too large: 502 before reading it; chunked: 502 once past the limit; just under: 200."""
    ok = http.post(CHAT, content=BODY[:-1] + b',"fake_bytes":' + str(RESPONSE_LIMIT - 4096).encode() + b"}")
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"].startswith("xxx")
    for declare in (b"true", b"false"):
        body = BODY[:-1] + b',"fake_bytes":' + str(64 * MIB).encode() + b',"fake_declare":' + declare + b"}"
        resp = http.post(CHAT, content=body)
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_answer_too_large"
        stream = served.streams[-1]
        assert until(partial(getattr, stream, "ended")), "the pod is still sending the answer"
        assert stream.sent * 64 * 1024 < 16 * MIB, (declare, stream.sent)
    metrics = served.app.state.gateway.metrics.registry
    assert served.on_loop(lambda: metrics.get_sample_value(
        "llamafleet_router_requests_total", {"model": "fake", "key": "fuzz", "status": "502"})) == 2


# --- heads (finding 14) -------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_router_process_refuses_a_huge_header_before_forwarding_it(tmp_path: Path) -> None:
    """`llamafleet router` itself: a 1 MiB header (in the `accept` the pod would get) is refused with
    431, or the connection is closed on it, and never reaches the pod; 8 KiB of headers are served."""
    with rp.pod_in_thread() as pod, rp.router_process(pod.url, tmp_path) as router:
        # The pod's record of inference bodies (this router's discovery polls are not marked).
        raw = head({"authorization": rp.AUTH["Authorization"], "accept": "a" * MIB}) + BODY
        answer, reset = exchange(router.url, raw)
        assert (answer and status_of(answer) == 431) or (reset and not answer), answer[:200]
        assert not pod.received, "the request reached the pod"
        answer, _ = exchange(router.url, head({"authorization": rp.AUTH["Authorization"],
                                               "x-pad": "p" * 8192}) + BODY)
        assert status_of(answer) == 200
        assert len(pod.received) == 1


@pytest.mark.parametrize("size", [40 * 1024, MIB])
def test_a_head_over_the_limit_gets_431_and_is_never_forwarded(served: Served, size: int) -> None:
    """40 KiB arrives in one read (measured when parsed), 1 MiB in many (counted as it comes): both
    over the default 32 KiB, both refused before authentication; the pod never sees them."""
    before = len(forwarded(served.hits))
    answer, reset = exchange(served.url, head({"x-pad": "p" * size}) + BODY)
    if answer:
        assert status_of(answer) == 431, answer[:200]
        assert b"request_header_fields_too_large" in answer
    else:
        assert reset
    assert len(forwarded(served.hits)) == before
    # Not a refusal of large heads in general: 16 KiB is served.
    answer, _ = exchange(served.url, head({"x-pad": "p" * 16 * 1024}) + BODY)
    assert status_of(answer) == 200 and len(forwarded(served.hits)) == before + 1


def test_a_head_trickled_slowly_is_cut_after_the_header_timeout(served: Served) -> None:
    before = len(forwarded(served.hits))
    with socket.create_connection(address(served.url), timeout=15) as sock:
        sock.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nhost: x\r\n")
        seconds = trickle_until_answered(sock, forever(b"x-slow: 1\r\n"), limit=20 * HEAD_TIMEOUT)
        answer = read_to_close(sock)
    assert seconds >= HEAD_TIMEOUT * 0.9, seconds
    assert not answer or status_of(answer) == 408, answer[:200]
    assert len(forwarded(served.hits)) == before


def test_a_connection_that_never_sends_a_head_is_closed(served: Served) -> None:
    with socket.create_connection(address(served.url), timeout=15) as sock:
        started = time.monotonic()
        readable, _, _ = select.select([sock], [], [], 20 * HEAD_TIMEOUT)
        assert readable, "the idle connection is still open"
        assert read_to_close(sock) == b"" and time.monotonic() - started >= HEAD_TIMEOUT * 0.9


def test_requests_on_a_kept_alive_connection_are_not_cut(http: httpx.Client) -> None:
    """The head timer restarts with each request: several requests on one connection, each answered."""
    for _ in range(5):
        assert http.post(CHAT, content=BODY, headers={"content-type": "application/json"}).status_code == 200


# --- bodies (finding 14) ------------------------------------------------------------------------------

def test_a_body_trickled_slower_than_the_body_timeout_gets_408(served: Served) -> None:
    before = len(forwarded(served.hits))
    with socket.create_connection(address(served.url), timeout=15) as sock:
        sock.sendall(head({}, length=1000) + b'{"model":"fake",')
        seconds = trickle_until_answered(sock, forever(b" "), limit=20 * BODY_TIMEOUT)
        answer = read_to_close(sock)
    assert seconds >= BODY_TIMEOUT * 0.9
    assert status_of(answer) == 408, answer[:300]
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")
    assert len(forwarded(served.hits)) == before


# --- a client leaving mid-upload (finding 20) ---------------------------------------------------------

def test_a_client_leaving_mid_upload_is_a_counted_disconnect_not_an_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llamafleet_router")
    registry = served.app.state.gateway.metrics.registry

    def disconnects() -> float:
        return float(served.on_loop(
            lambda: registry.get_sample_value("llamafleet_router_client_disconnects_total")))

    before = disconnects()
    with socket.create_connection(address(served.url), timeout=15) as sock:
        sock.sendall(head({}, length=10_000) + b'{"model":"fake","messages":[')
    deadline = time.monotonic() + 10
    while disconnects() == before:
        assert time.monotonic() < deadline, "the disconnect was never counted"
        time.sleep(0.02)
    records = [r for r in caplog.records if r.name.startswith("llamafleet_router")]
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
    refused = [r for r in records if getattr(r, "code", None) == "client_disconnected"]
    assert refused and all(r.levelno == logging.INFO and not r.exc_info for r in refused)

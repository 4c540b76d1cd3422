"""Per-key limits over a served gateway (real uvicorn, real proxy path, a fake pod): requests and tokens
per minute and requests in flight, per API key name, each past its limit a 429 with `retry-after` in the
shape of the API called, never forwarded; other keys unaffected; and whatever way a request ends, its
place in its key's in-flight count is given back.

Each test uses a key of its own (the limits are per key name, and a minute's allowance does not refill
within a test run)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tests.fuzz.served import Served, served_gateway

KEYS = {name: f"{name}-secret-0123456789" for name in ("rpm", "tpm", "anth", "conc", "ends", "free")}
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSE_LIMIT = 1024 * 1024


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway(
        api_keys=SecretStr(",".join(f"{name}:{key}" for name, key in KEYS.items())),
        key_requests_per_minute="rpm:2,anth:1",
        key_tokens_per_minute="tpm:100",
        key_concurrent_requests="conc:1,ends:1",
        max_response_bytes=RESPONSE_LIMIT,
    ) as s:
        yield s


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=15.0) as client:
        yield client
    assert served.leaks() == (0, 0), "a request is still counted in flight or holds a slot lease"


def in_flight(served: Served, key: str) -> int:
    limiter = served.app.state.gateway.limiter
    return int(served.on_loop(lambda: limiter.in_flight(key)))


def until(check: Callable[[], bool], limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def assert_openai_429(resp: httpx.Response, kind: str) -> None:
    assert resp.status_code == 429, resp.text[:300]
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    error = resp.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == kind and error["message"]


def test_requests_per_minute_past_the_limit_get_429_and_never_reach_the_pod(
    served: Served, http: httpx.Client
) -> None:
    before = len(served.received)
    assert [http.post(CHAT, json=chat(), headers=auth("rpm")).status_code for _ in range(2)] == [200, 200]
    refused = http.post(CHAT, json=chat(), headers=auth("rpm"))
    assert_openai_429(refused, "requests")
    assert int(refused.headers["retry-after"]) <= 30  # 2 a minute: one more every 30 s
    assert len(served.received) == before + 2
    assert http.post(CHAT, json=chat(), headers=auth("free")).status_code == 200  # other keys: served


def test_tokens_per_minute_charge_max_tokens_up_front(served: Served, http: httpx.Client) -> None:
    # 100 a minute: 90 now leaves 10, and the 90 more a full 100 needs take 54 s to come back.
    assert http.post(CHAT, json=chat(max_tokens=90), headers=auth("tpm")).status_code == 200
    assert_openai_429(http.post(CHAT, json=chat(max_tokens=100), headers=auth("tpm")), "tokens")
    too_large = http.post(CHAT, json=chat(max_tokens=500), headers=auth("tpm"))
    assert_openai_429(too_large, "tokens")
    assert "too large" in too_large.json()["error"]["message"]
    # What is left of the minute (10 tokens) is still there: the refusals spent nothing.
    assert http.post(CHAT, json=chat(max_tokens=10), headers=auth("tpm")).status_code == 200


def test_anthropic_route_gets_an_anthropic_shaped_429(http: httpx.Client) -> None:
    body = {"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    assert http.post(MESSAGES, json=body, headers=auth("anth")).status_code == 200
    refused = http.post(MESSAGES, json=body, headers=auth("anth"))
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    payload = refused.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "rate_limit_error"
    assert payload["error"]["message"]


def test_concurrent_streams_past_the_limit_get_429_until_one_ends(served: Served, http: httpx.Client) -> None:
    with http.stream("POST", CHAT, json=chat(stream=True, fake_events=100_000), headers=auth("conc")) as long:
        assert long.status_code == 200
        chunks = long.iter_raw()  # kept: closing this iterator closes the connection
        assert next(chunks)  # streaming: the request is in flight
        assert in_flight(served, "conc") == 1
        refused = http.post(CHAT, json=chat(), headers=auth("conc"))
        assert_openai_429(refused, "requests")
        assert "in flight" in refused.json()["error"]["message"]
        assert http.post(CHAT, json=chat(), headers=auth("free")).status_code == 200
        assert next(chunks)  # still streaming, still the one in flight
    # The client left mid-stream: its place is given back, and the key is served again.
    assert until(lambda: in_flight(served, "conc") == 0), "the abandoned stream still counts in flight"
    assert http.post(CHAT, json=chat(), headers=auth("conc")).status_code == 200
    assert in_flight(served, "conc") == 0


def test_every_way_a_request_ends_gives_its_place_back(served: Served, http: httpx.Client) -> None:
    """With one request in flight allowed, each of these ends and the next is admitted: an answer, a
    stream read to its end, an unknown model (refused after admission), an upstream answer too large
    (502), and a stream the client abandons."""
    def admitted_after(resp_status: int, expected: int) -> None:
        assert resp_status == expected
        assert until(lambda: in_flight(served, "ends") == 0), f"still in flight after a {expected}"

    admitted_after(http.post(CHAT, json=chat(), headers=auth("ends")).status_code, 200)
    with http.stream("POST", CHAT, json=chat(stream=True), headers=auth("ends")) as done:
        assert b"[DONE]" in done.read()
    admitted_after(done.status_code, 200)
    admitted_after(http.post(CHAT, json=chat(model="nope"), headers=auth("ends")).status_code, 404)
    too_large = http.post(CHAT, json=chat(fake_bytes=4 * RESPONSE_LIMIT), headers=auth("ends"))
    admitted_after(too_large.status_code, 502)
    with http.stream("POST", CHAT, json=chat(stream=True, fake_events=100_000), headers=auth("ends")) as left:
        assert next(left.iter_raw())
    admitted_after(left.status_code, 200)
    assert http.post(CHAT, json=chat(), headers=auth("ends")).status_code == 200

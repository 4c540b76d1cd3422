"""The gateway's attack surface, over a fake pod that records every path it is asked for:

- without a key or with a wrong one: 401 on every inference and model route, the key never echoed;
- a client's `id_slot` never reaches the pod: the router's slot does;
- no llama-server route other than the inference ones is reachable through the gateway: every
  route registered in llama.cpp's server sources (read from the pinned tree, so a new upstream route is
  tested the day it appears) answers the gateway's own 404/405 or its own handler, and the pod never
  sees the request, whatever the path tricks (dot segments, encoded slashes, double slashes).

The fake pod answers every route 200 (a catch-all for those it does not implement), so a forwarded
request fails both checks: the pod's record and the status. The only requests the record may show are
discovery's own polls, known by method, exact target and the mark the harness puts on what the gateway
sends outside a client request (served.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llamafleet_testbed.llama_build import source_dir
from tests.fuzz.fake_pod import Hit
from tests.fuzz.served import API_KEY, AUTH, Served, served_gateway

INFERENCE = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
             "/v1/responses", "/v1/embeddings"}
OWN = {"/health", "/metrics", "/v1/models", "/openapi.json"}  # served by the gateway itself
_ROUTE = re.compile(r'ctx_http\.(get|post|put|del)\s*\(\s*"([^"]+)"')
CHAT = {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
# What discovery sends (discovery/static.py): GET /health and /props while a pod is down, GET /slots
# while it is up; nothing else, and never a query string.
DISCOVERY = {("GET", "/health"), ("GET", "/props"), ("GET", "/slots")}


def forwarded(hits: list[Hit]) -> list[Hit]:
    """The requests a client's request made the gateway send: all but discovery's own polls."""
    return [h for h in hits if not (h.background and (h.method, h.target) in DISCOVERY)]


def llama_server_routes() -> list[tuple[str, str]]:
    """Every (METHOD, path) llama-server registers, from its sources (`:param` filled with 0)."""
    found: set[tuple[str, str]] = set()
    for source in sorted((Path(source_dir()) / "tools" / "server").glob("server*.cpp")):
        for method, path in _ROUTE.findall(source.read_text(errors="replace")):
            found.add(({"del": "DELETE"}.get(method, method.upper()), re.sub(r":\w+", "0", path)))
    return sorted(found)


@pytest.fixture(scope="module")
def routes() -> list[tuple[str, str]]:
    return llama_server_routes()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway() as s:
        yield s


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def test_discovery_polls_are_the_only_requests_the_pod_sees_on_its_own(served: Served) -> None:
    """The filter above removes what it should and no more: discovery's polls arrive marked and are
    exactly the DISCOVERY requests, a forwarded inference request arrives unmarked, and the fake pod
    answers a route it does not implement (POST /props) with 200 and records it."""
    resp = httpx.post(served.url + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=10)
    assert resp.status_code == 200
    polls = [h for h in served.hits if h.background]
    assert {(h.method, h.target) for h in polls} == {("GET", "/health"), ("GET", "/props"), ("GET", "/slots")}
    assert Hit("POST", "/v1/chat/completions", False) in served.hits
    before = len(served.hits)
    direct = httpx.post(served.pod_url + "/props?x=1", json={}, timeout=10)
    assert direct.status_code == 200
    assert forwarded(served.hits[before:]) == [Hit("POST", "/props?x=1", False)]


@pytest.mark.models
def test_the_route_list_is_read_from_llama_server_sources(routes: list[tuple[str, str]]) -> None:
    """The list is not empty by accident: it holds the admin routes the design forbids."""
    paths = {p for _, p in routes}
    assert {"/slots/0", "/props", "/tokenize", "/apply-template", "/completion"} <= paths, paths
    assert len(routes) > 30


BODIES = {"/v1/completions": {"model": "fake", "prompt": "hi", "max_tokens": 2},
          "/v1/messages/count_tokens": {"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
          "/v1/responses": {"model": "fake", "input": "hi", "max_output_tokens": 2},
          "/v1/embeddings": {"model": "fake", "input": "hi"}}


@pytest.mark.parametrize("path", [*sorted(INFERENCE), "/v1/models", "/v1/models/fake"])
def test_requests_get_401_when_the_key_is_missing_or_wrong(served: Served, path: str) -> None:
    method = "GET" if path.startswith("/v1/models/") or path == "/v1/models" else "POST"
    body = BODIES.get(path, CHAT)
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"x-api-key": "wrong-key"},
                    {"Authorization": f"Basic {API_KEY}"}, {"Authorization": f"Bearer {API_KEY}x"}):
        resp = httpx.request(method, served.url + path, json=body, headers=headers, timeout=10)
        assert resp.status_code == 401, (path, headers, resp.status_code)
        assert "wrong-key" not in resp.text and API_KEY not in resp.text
        assert resp.json()["error"]["type"] in ("invalid_request_error", "authentication_error")
        assert path.startswith("/v1/messages") == (resp.json().get("type") == "error")  # Anthropic's
    ok = httpx.request(method, served.url + path, json=body, headers={"x-api-key": API_KEY}, timeout=10)
    assert ok.status_code == 200


def test_a_clients_id_slot_never_reaches_the_pod(served: Served) -> None:
    """Whatever `id_slot` the client sends (a valid one, out of range, negative, a string), the pod
    receives the slot the router chose, which is also the one the response header names."""
    for client_slot in (1, 0, 99, -1, "0", None, [1]):
        before = len(served.received)
        resp = httpx.post(served.url + "/v1/chat/completions", json={**CHAT, "id_slot": client_slot},
                          headers=AUTH, timeout=10)
        assert resp.status_code == 200, (client_slot, resp.text)
        router_slot = int(resp.headers["x-llamafleet-slot"])
        bodies = served.received[before:]
        assert [b["id_slot"] for b in bodies] == [router_slot], (client_slot, bodies)
        assert resp.json()["id_slot"] == router_slot  # what the pod answered


@pytest.mark.models
def test_no_llama_server_route_but_inference_reaches_the_pod(
    served: Served, client: httpx.Client, routes: list[tuple[str, str]],
) -> None:
    """Each route, as is and disguised: the gateway answers it itself and the pod is never asked. (One
    test over every route: the list is read from the sources when the test runs, not at collection, so
    the fast suite collects this module without the sdist.)"""
    failures = []
    for method, path in routes:
        if path in INFERENCE and method == "POST":
            continue  # inference routes are proxied by design
        failures += route_failures(served, client, method, path)
    assert not failures, "\n".join(failures)


def route_failures(served: Served, client: httpx.Client, method: str, path: str) -> list[str]:
    failures = []
    disguises = [path, f"/v1/chat/completions/..{path}", f"//{path.lstrip('/')}",
                 "/" + path.lstrip("/").replace("/", "%2F"), f"{path}?id_slot=0&action=save"]
    for attempt in disguises:
        before = len(served.hits)
        resp = client.request(method, served.url + attempt, headers=AUTH, json={"filename": "x.bin"})
        new = forwarded(served.hits[before:])
        if new:
            failures.append(f"{method} {attempt}: reached the pod as {[str(h) for h in new]}")
        if attempt == path:  # disguises may normalize to one of the gateway's own routes
            allowed = (200, 401, 503) if path in OWN and method == "GET" else (401, 404, 405)
            if resp.status_code not in allowed:
                failures.append(f"{method} {attempt}: {resp.status_code}, expected one of {allowed}")
        if resp.status_code >= 500:
            failures.append(f"{method} {attempt}: {resp.status_code}")
    return failures

"""Every error the gateway answers itself is OpenAI-shaped (Anthropic-shaped on the Anthropic routes);
bad input is a 4xx, never a 5xx."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from llamafleet_router.inprocess import app_client
from tests.router.conftest import AppFactory, chat_body
from tests.router.fakes import FakeFleet


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


def assert_anthropic_error(resp: httpx.Response, status: int, kind: str) -> str:
    """Anthropic's `{"type": "error", "error": {"type", "message"}}`; returns the message."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == kind and isinstance(body["error"]["message"], str), body
    return str(body["error"]["message"])


BAD_BODIES: list[tuple[str, str, bytes | str]] = [
    ("/v1/chat/completions", "malformed json", b'{"model": "tiny", "messages": ['),
    ("/v1/chat/completions", "empty body", b""),
    ("/v1/chat/completions", "not an object", b"[1, 2]"),
    ("/v1/chat/completions", "a string", b'"hello"'),
    ("/v1/chat/completions", "invalid utf-8", b'{"messages": "\xff\xfe"}'),
    ("/v1/chat/completions", "NaN", b'{"model": "tiny", "temperature": NaN, "messages": []}'),
    ("/v1/chat/completions", "missing messages", json.dumps({"model": "tiny"})),
    ("/v1/chat/completions", "messages not a list", json.dumps({"model": "tiny", "messages": "hi"})),
    ("/v1/chat/completions", "empty messages", json.dumps({"model": "tiny", "messages": []})),
    ("/v1/chat/completions", "message not an object", json.dumps({"model": "tiny", "messages": ["hi"]})),
    ("/v1/chat/completions", "role missing", json.dumps({"model": "tiny", "messages": [{"content": "x"}]})),
    (
        "/v1/chat/completions",
        "content a number",
        json.dumps({"model": "tiny", "messages": [{"role": "user", "content": 5}]}),
    ),
    ("/v1/chat/completions", "model not a string", json.dumps(chat_body(model=7))),
    ("/v1/chat/completions", "stream not a bool", json.dumps(chat_body(stream="yes"))),
    ("/v1/chat/completions", "tools not a list", json.dumps(chat_body(tools={"a": 1}))),
    ("/v1/chat/completions", "deeply nested", b"[" * 100000 + b"]" * 100000),
    ("/v1/completions", "missing prompt", json.dumps({"model": "tiny"})),
    ("/v1/completions", "prompt an object", json.dumps({"model": "tiny", "prompt": {"a": 1}})),
    ("/v1/completions", "prompt empty list", json.dumps({"model": "tiny", "prompt": []})),
    (
        "/v1/messages",
        "system a number",
        json.dumps({"model": "tiny", "system": 3, "messages": [{"role": "user", "content": "x"}]}),
    ),
    ("/v1/messages", "missing messages", json.dumps({"model": "tiny", "max_tokens": 5})),
    ("/v1/messages", "malformed json", b'{"model": "tiny", "messages": ['),
    ("/v1/messages/count_tokens", "missing messages", json.dumps({"model": "tiny"})),
    ("/v1/messages/count_tokens", "max_tokens", json.dumps(
        {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})),
    ("/v1/responses", "missing input", json.dumps({"model": "tiny"})),
    ("/v1/responses", "input a number", json.dumps({"model": "tiny", "input": 5})),
    ("/v1/responses", "previous response", json.dumps({"model": "tiny", "input": "x",
                                                      "previous_response_id": "resp_1"})),
    ("/v1/responses", "web search tool", json.dumps({"model": "tiny", "input": "x",
                                                    "tools": [{"type": "web_search"}]})),
    ("/v1/responses", "json schema output", json.dumps({"model": "tiny", "input": "x", "text": {
        "format": {"type": "json_schema", "name": "x", "schema": {}}}})),
    ("/v1/responses", "no user item", json.dumps({"model": "tiny", "input": [
        {"role": "system", "content": "x"}]})),
    ("/v1/embeddings", "missing input", json.dumps({"model": "tiny"})),
    ("/v1/embeddings", "empty input", json.dumps({"model": "tiny", "input": []})),
    ("/v1/embeddings", "dimensions", json.dumps({"model": "tiny", "input": "x", "dimensions": 8})),
]


@pytest.mark.parametrize(("path", "case", "body"), BAD_BODIES, ids=[c for _, c, _ in BAD_BODIES])
async def test_bad_input_gets_openai_400_when_body_is_invalid(
    make_app: AppFactory, fleet: FakeFleet, path: str, case: str, body: bytes | str
) -> None:
    """Malformed or mistyped bodies are refused with 400 in the route's API shape; nothing reaches a pod."""
    async with app_client(make_app()) as client:
        resp = await client.post(path, content=body, headers={"content-type": "application/json"})
    if path.startswith("/v1/messages"):
        assert_anthropic_error(resp, 400, "invalid_request_error")
    else:
        assert assert_openai_error(resp, 400)["type"] == "invalid_request_error"
    assert all(not pod.requests for pod in fleet.pods.values())


async def test_unknown_model_gets_404_model_not_found_when_no_pod_serves_it(make_app: AppFactory) -> None:
    async with app_client(make_app()) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(model="gpt-9"))
    assert assert_openai_error(resp, 404)["code"] == "model_not_found"


async def test_missing_model_uses_the_fleets_only_model(make_app: AppFactory, fleet: FakeFleet) -> None:
    """Clients that omit `model` are served when the fleet has exactly one model."""
    body = chat_body()
    del body["model"]
    async with app_client(make_app()) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text


async def test_all_pods_down_gets_503_in_openai_shape(make_app: AppFactory, fleet: FakeFleet) -> None:
    """Pods exist but none is up: 503 (the one 5xx the router answers itself), not 404."""
    app = make_app()
    async with app_client(app) as client:
        for pod in fleet.pods.values():
            pod.healthy = False
        await app.state.gateway.discovery.poll_once()
        resp = await client.post("/v1/chat/completions", json=chat_body())
        health = await client.get("/health")
    assert assert_openai_error(resp, 503)["type"] == "service_unavailable_error"
    assert health.status_code == 503
    assert health.json()["pods_up"] == 0 and health.json()["pods_down"] == 2


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/slots"),
        ("POST", "/slots/0?action=save"),
        ("POST", "/slots/0?action=restore"),
        ("GET", "/props"),
        ("POST", "/props"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("POST", "/completion"),
        ("POST", "/infill"),
        ("POST", "/embedding"),
        ("GET", "/v1/slots"),
        ("POST", "/v1/responses/input_tokens"),
        ("GET", "/"),
        ("POST", "/v1/chat/completions/input_tokens"),
    ],
)
async def test_admin_and_unknown_paths_get_404_when_requested(
    make_app: AppFactory, fleet: FakeFleet, method: str, path: str
) -> None:
    """llama-server's admin endpoints are never proxied: the client gets an OpenAI-shaped 404."""
    async with app_client(make_app()) as client:
        resp = await client.request(method, path, json={"content": "x"})
    assert_openai_error(resp, 404)
    assert all(not pod.requests for pod in fleet.pods.values())


async def test_wrong_method_gets_405_in_openai_shape(make_app: AppFactory) -> None:
    async with app_client(make_app()) as client:
        resp = await client.get("/v1/chat/completions")
    assert_openai_error(resp, 405)


async def test_oversized_body_gets_413_when_content_length_exceeds_limit(make_app: AppFactory) -> None:
    body = json.dumps(chat_body()).encode()
    async with app_client(make_app(max_body_bytes=len(body) - 1)) as client:
        ok = await client.post("/v1/chat/completions", content=body[:-1])
        resp = await client.post("/v1/chat/completions", content=body)
    assert ok.status_code == 400  # exactly at the limit it is read (and here, truncated JSON)
    assert assert_openai_error(resp, 413)["code"] == "request_too_large"


async def test_oversized_body_gets_413_when_streamed_without_content_length(make_app: AppFactory) -> None:
    """A chunked body is counted while it is read, so a missing Content-Length cannot bypass the limit."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 100

    async with app_client(make_app(max_body_bytes=1000)) as client:
        resp = await client.post("/v1/chat/completions", content=chunks())
    assert assert_openai_error(resp, 413)["code"] == "request_too_large"


async def test_request_id_is_echoed_and_generated(make_app: AppFactory) -> None:
    async with app_client(make_app()) as client:
        given = await client.get("/health", headers={"x-request-id": "abc-123"})
        fresh = await client.get("/nope")
    assert given.headers["x-request-id"] == "abc-123"
    assert len(fresh.headers["x-request-id"]) == 32


async def test_inference_routes_echo_the_request_id_and_answer_their_own_failures(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inference routes skip Starlette's middleware: the request id still rides every answer (a
    stream, a refusal), a GET still gets 405, and a bug still becomes an OpenAI-shaped 500."""
    app = make_app()
    async with app_client(app) as client:
        streamed = await client.post("/v1/chat/completions", json=chat_body(stream=True),
                                     headers={"x-request-id": "rid-1"})
        refused = await client.post("/v1/completions", content=b"{", headers={"x-request-id": "rid-2"})
        wrong_method = await client.get("/v1/chat/completions")

        def broken(*args: Any) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(app.state.gateway.prompts, "identity", broken)
        failed = await client.post("/v1/chat/completions", json=chat_body())
    assert (streamed.status_code, streamed.headers["x-request-id"]) == (200, "rid-1")
    assert (refused.status_code, refused.headers["x-request-id"]) == (400, "rid-2")
    assert wrong_method.status_code == 405 and len(wrong_method.headers["x-request-id"]) == 32
    assert wrong_method.headers["allow"] == "POST"
    assert assert_openai_error(failed, 500)["code"] == "internal_error"
    assert len(failed.headers["x-request-id"]) == 32


async def test_models_lists_the_fleets_models(make_app: AppFactory) -> None:
    async with app_client(make_app()) as client:
        resp = await client.get("/v1/models")
    assert resp.status_code == 200
    assert [m["id"] for m in resp.json()["data"]] == ["tiny"]


async def test_auth_rejects_missing_and_wrong_keys_and_accepts_the_right_one(
    make_app: AppFactory, fleet: FakeFleet, caplog: pytest.LogCaptureFixture
) -> None:
    """401 in OpenAI's shape without a key or with a wrong one; the key NAME reaches metrics, the key
    itself never reaches logs or metrics."""
    secret = "sk-very-secret-123"
    caplog.set_level(logging.DEBUG)
    async with app_client(make_app(api_keys=f"alice:{secret},bob:other", admin_keys="alice")) as client:
        missing = await client.post("/v1/chat/completions", json=chat_body())
        wrong = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-wrong"}
        )
        bearer = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": f"Bearer {secret}"}
        )
        header = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-api-key": "other"})
        models = await client.get("/v1/models")
        metrics = (await client.get("/metrics", headers={"authorization": f"Bearer {secret}"})).text  # admin
    assert assert_openai_error(missing, 401)["type"] == "invalid_request_error"
    assert assert_openai_error(wrong, 401)["type"] == "authentication_error"
    assert assert_openai_error(models, 401)
    assert bearer.status_code == 200 and header.status_code == 200
    assert 'key="alice",model="tiny",status="200"' in metrics
    assert 'key="bob",model="tiny",status="200"' in metrics
    assert secret not in metrics and "sk-wrong" not in metrics
    assert secret not in caplog.text and "sk-wrong" not in caplog.text
    # the pods never see the client's credentials
    for pod in fleet.pods.values():
        for req in pod.requests:
            assert "authorization" not in req["headers"] and "x-api-key" not in req["headers"]

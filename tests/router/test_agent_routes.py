"""The gateway's own handling of the endpoints agents call, over the fake fleet: Anthropic-shaped errors
on the Anthropic routes (auth, model, limits, no pod, method, a stream cut midway), token counts and
embeddings sent to a pod without scheduling a slot, embeddings moving off pods that do not serve them,
and the models' context length. What llama-server answers is the real-server tests' business."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from llamafleet_router.inprocess import app_client, serve
from llamafleet_router.scheduling.framework import Decision, EndpointState, SchedRequest
from tests.router.conftest import POD_A, POD_B, AppFactory
from tests.router.fakes import FakeFleet
from tests.router.test_api_errors import assert_anthropic_error, assert_openai_error

MESSAGES = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
COUNT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}


class NeverScheduler:
    """Fails the test if anything asks it for a slot."""

    speeds = None

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def schedule(self, req: SchedRequest, endpoints: Sequence[EndpointState]) -> Decision:
        self.asked.append(req.request_id)
        raise AssertionError("a route that generates nothing was scheduled")

    async def release(self, decision: Decision) -> None:
        raise AssertionError("nothing was scheduled")


async def test_anthropic_routes_answer_the_gateways_errors_in_anthropics_shape(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    app = make_app(api_keys="alice:secret-a", key_requests_per_minute=["2"])
    alice = {"x-api-key": "secret-a"}
    async with app_client(app) as client:
        for path, body in (("/v1/messages", MESSAGES), ("/v1/messages/count_tokens", COUNT)):
            assert_anthropic_error(await client.post(path, json=body), 401, "authentication_error")
            unknown = await client.post(path, json={**body, "model": "gpt-9"}, headers=alice)
            assert "gpt-9" in assert_anthropic_error(unknown, 404, "not_found_error")
        limited = await client.post("/v1/messages", json=MESSAGES, headers=alice)
        assert "Rate limit" in assert_anthropic_error(limited, 429, "rate_limit_error")
        assert limited.headers["retry-after"]
        assert_anthropic_error(await client.get("/v1/messages"), 405, "invalid_request_error")
        # The OpenAI routes keep OpenAI's shape.
        assert_openai_error(await client.post("/v1/responses", json={"input": "x"}), 401)
    assert all(not pod.requests for pod in fleet.pods.values())


async def test_no_pod_is_an_anthropic_overloaded_error(make_app: AppFactory, fleet: FakeFleet) -> None:
    for pod in fleet.pods.values():
        pod.refuse_inference = True
    async with app_client(make_app()) as client:
        resp = await client.post("/v1/messages", json=MESSAGES)
    assert_anthropic_error(resp, 503, "overloaded_error")


def _events(raw: bytes) -> list[tuple[str | None, Any]]:
    """The stream's complete events: (event name, data)."""
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = block.decode().splitlines()
        data = [ln[6:] for ln in lines if ln.startswith("data: ")]
        if data and data[0] != "[DONE]":
            name = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
            try:
                events.append((name, json.loads(data[0])))
            except ValueError:  # the event the pod left half-written when it failed
                continue
    return events


async def test_a_stream_cut_midway_ends_with_the_error_event_of_its_api(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    for pod in fleet.pods.values():
        pod.stream_mode = {"fail_after": 2}
    app = make_app()
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        messages = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
        responses = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True})
        await app.state.gateway.tasks.drain(5.0)
    name, data = _events(messages.content)[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    name, data = _events(responses.content)[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["code"] == "upstream_error"
    assert app.state.gateway.in_flight.total() == 0


async def test_token_counts_and_embeddings_take_no_slot(make_app: AppFactory, fleet: FakeFleet) -> None:
    scheduler = NeverScheduler()
    app = make_app(scheduler=scheduler)
    async with app_client(app) as client:
        count = await client.post("/v1/messages/count_tokens", json=COUNT)
        embedded = await client.post("/v1/embeddings", json={"model": "tiny", "input": ["a", "b"]})
    assert count.status_code == 200 and count.json() == {"input_tokens": 42}
    assert embedded.status_code == 200 and embedded.json()["data"][0]["embedding"] == [0.25, -0.5]
    assert scheduler.asked == []
    sent = [r for pod in fleet.pods.values() for r in pod.requests]
    assert [r["path"] for r in sent] == ["/v1/messages/count_tokens", "/v1/embeddings"]
    assert all("id_slot" not in r["body"] for r in sent)  # the server picks; nothing is pinned
    assert app.state.gateway.in_flight.total() == 0


async def test_embeddings_move_to_a_pod_that_serves_them_and_remember_the_others(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    fleet.pods[POD_A].embeddings = False
    app = make_app()
    async with app_client(app) as client:
        answers = [await client.post("/v1/embeddings", json={"model": "tiny", "input": "a"}) for _ in "abc"]
        fleet.pods[POD_B].embeddings = False  # and it says so: B is asked once more, then A is not
        gateway = app.state.gateway
        refused = await client.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert len(fleet.pods[POD_A].requests) == 1  # asked once: then known not to serve them
    assert len(fleet.pods[POD_B].requests) == 4
    assert not any(gateway.embedding_pods.serves(p.endpoint.uid) for p in await gateway.discovery.endpoints())
    err = assert_openai_error(refused, 400)
    assert err["code"] == "model_not_embedding" and "`tiny`" in err["message"]


async def test_embeddings_on_a_fleet_without_them_are_a_400_for_the_model(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    for pod in fleet.pods.values():
        pod.embeddings = False
    async with app_client(make_app()) as client:
        first = await client.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
        again = await client.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
    for resp in (first, again):
        assert assert_openai_error(resp, 400)["code"] == "model_not_embedding"
    assert [len(pod.requests) for pod in fleet.pods.values()] == [1, 1]


async def test_models_carry_their_context_length_and_one_can_be_read(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    fleet.pods[POD_A].n_ctx, fleet.pods[POD_B].n_ctx = 8192, 6144
    async with app_client(make_app()) as client:
        listed = (await client.get("/v1/models")).json()
        one = await client.get("/v1/models/tiny")
        unknown = await client.get("/v1/models/gpt-9")
    [entry] = listed["data"]
    assert entry["id"] == "tiny" and entry["context_length"] == 6144 == entry["max_model_len"]
    assert one.status_code == 200 and one.json() == entry
    assert assert_openai_error(unknown, 404)["code"] == "model_not_found"


async def test_responses_are_scheduled_like_chat_with_the_length_cap(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    body: dict[str, Any] = {"model": "tiny", "instructions": "Be terse.", "input": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"}]}
    async with app_client(make_app(max_tokens_per_request=["64"])) as client:
        resp = await client.post("/v1/responses", json=body)
    assert resp.status_code == 200, resp.text
    [sent] = [r for pod in fleet.pods.values() for r in pod.requests]
    assert sent["path"] == "/v1/responses" and isinstance(sent["body"]["id_slot"], int)
    assert sent["body"]["max_output_tokens"] == 64 and "max_tokens" not in sent["body"]
    assert sent["body"]["input"][1] == {"role": "assistant", "content": "hello", "type": "message"}

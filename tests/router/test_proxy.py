"""The proxy's own behaviour, through a real uvicorn server (true streaming and disconnects) in front of a
fake llama-server fleet."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.index.memory_leases import InMemorySlotLeases
from llamafleet_core.types import SlotRef
from llamafleet_router.api.parse import Route, parse_request
from llamafleet_router.fleet.state import props_for
from llamafleet_router.inprocess import app_client, serve
from llamafleet_router.scheduling.framework import Branch, Decision
from tests.router.conftest import POD_A, POD_B, AppFactory, chat_body
from tests.router.fakes import FakeFleet, FirstEndpointScheduler, sse_chunks


async def _settle(app) -> None:  # type: ignore[no-untyped-def]
    await app.state.gateway.tasks.drain(5.0)


async def test_stream_is_relayed_byte_for_byte_when_upstream_splits_chunks_oddly(
    make_app: AppFactory, fleet: FakeFleet, index: InMemoryPrefixIndex
) -> None:
    """The client receives exactly the upstream's bytes, and the final chunk's timings are read from the
    tee'd copy: the slot is recorded in the index with the prompt's blocks."""
    app = make_app()
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        received = b""
        async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for chunk in resp.aiter_raw():
                received += chunk
        await _settle(app)
        metrics = (await client.get("/metrics")).text
    assert received == b"".join(sse_chunks())
    pod = next(p for p in fleet.pods.values() if p.requests)
    slot = pod.requests[0]["body"]["id_slot"]
    uid = next(
        s.endpoint.uid for s in await app.state.gateway.discovery.endpoints() if s.endpoint.url == pod.url
    )
    parsed = parse_request(Route.CHAT, json.dumps(chat_body(stream=True)).encode())
    source = props_for("tiny", await app.state.gateway.discovery.endpoints())
    assert source is not None
    blocks = app.state.gateway.prompts.identity(parsed, "tiny", source.props).blocks
    assert len(blocks) > 1
    assert (await index.lookup("tiny", blocks)).slots == {SlotRef(uid, slot): len(blocks)}
    assert 'llamafleet_router_requests_total{key="anonymous",model="tiny",status="200"} 1.0' in metrics
    assert "llamafleet_router_actual_cached_tokens_total" in metrics


async def test_client_id_slot_is_overridden_and_cache_prompt_forced(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """Clients never choose the slot: their `id_slot` is replaced by the scheduler's, `cache_prompt` is on,
    and every other field reaches the pod unchanged."""
    scheduler = FirstEndpointScheduler()
    body = chat_body(id_slot=7, cache_prompt=False, temperature=0.25, max_tokens=5)
    async with app_client(make_app(scheduler=scheduler)) as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    sent = fleet.pods[POD_A].requests[0]["body"]
    assert sent["id_slot"] == scheduler.scheduled[0].slot == 0
    assert sent["cache_prompt"] is True
    assert {k: v for k, v in sent.items() if k not in ("id_slot", "cache_prompt")} == {
        k: v for k, v in body.items() if k not in ("id_slot", "cache_prompt")
    }


async def test_non_streaming_answer_and_upstream_errors_pass_through_with_status(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    async with app_client(make_app(scheduler=FirstEndpointScheduler())) as client:
        ok = await client.post("/v1/chat/completions", json=chat_body())
        fleet.pods[POD_A].status = 400
        refused = await client.post("/v1/chat/completions", json=chat_body())
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "hi"
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "upstream says no"


async def test_request_is_retried_on_another_pod_when_connection_is_refused(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """A refused connect before anything was streamed: pod marked down, request scheduled again on the next
    pod, the first decision's lease released, and the client sees a normal answer."""
    fleet.pods[POD_A].refuse_inference = True
    scheduler = FirstEndpointScheduler()
    app = make_app(scheduler=scheduler)
    async with app_client(app) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        await _settle(app)
        health = (await client.get("/health")).json()
        metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200
    assert resp.content == b"".join(sse_chunks())
    assert [d.endpoint.url for d in scheduler.scheduled] == [POD_A, POD_B]
    assert [d.endpoint.url for d in scheduler.released] == [POD_A, POD_B]
    assert {p["url"]: p["up"] for p in health["pods"]} == {POD_A: False, POD_B: True}
    assert "llamafleet_router_upstream_retries_total 1.0" in metrics
    assert app.state.gateway.in_flight.total() == 0


class _LateRecords(InMemoryPrefixIndex):
    """Holds back every slot record until a pod has been purged: the write of a request dispatched
    just before its pod died, still on its way when the purge ran."""

    def __init__(self) -> None:
        super().__init__()
        self.purged = asyncio.Event()

    async def record_slot(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        await self.purged.wait()
        await super().record_slot(*args, **kwargs)

    async def purge_pod(self, pod_uid: str) -> int:
        purged = await super().purge_pod(pod_uid)
        self.purged.set()
        return purged


async def test_a_refused_requests_provisional_slot_record_does_not_outlive_the_purge_of_its_pod(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """The slot record written when a request is forwarded lands after the purge that marking its pod
    down ran: it is dropped then, so the index names no slot of the dead pod while it stays dead (the
    next purge comes only when it is back). Seen in CI as a killed pod's entries outliving its purge."""
    fleet.pods[POD_A].refuse_inference = True
    index = _LateRecords()
    app = make_app(scheduler=FirstEndpointScheduler(), index_override=index, fenced=True)
    gateway = app.state.gateway
    async with app_client(app) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
        await _settle(app)
        source = props_for("tiny", await gateway.discovery.endpoints())
        assert source is not None
        parsed = parse_request(Route.CHAT, json.dumps(chat_body()).encode())
        found = await index.lookup("tiny", gateway.prompts.identity(parsed, "tiny", source.props).blocks)
    assert resp.status_code == 200 and index.purged.is_set()
    assert {ref.pod_uid for ref in found.slots} == {POD_B}  # the pod that answered, not the dead one


class _WaiterMoves:
    """A snapshot flow whose first-sight waiter finds an idle pod faster than the build it waited for
    (waits.py), once per request as the director allows; the rest of the flow does nothing."""

    def __init__(self) -> None:
        self.prepared: list[tuple[str, bool]] = []
        self.resync = self

    async def ensure(self, pods: object) -> None:
        return None

    async def prepare(self, req: object, decision: Decision, pods: object, *, may_move: bool = True,
                      ) -> Decision:
        self.prepared.append((decision.endpoint.url, may_move))
        return dataclasses.replace(decision, branch=Branch.FIRST_SIGHT_MOVED) if may_move else decision

    def request_answering(self, request_id: str) -> None:
        return None


async def test_a_first_sight_waiter_that_moves_is_scheduled_again_without_the_building_pod(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """The flow says a pod with an idle slot computes the head sooner than the build this request waited
    for on its pod: the slot is given back, the request is scheduled again without that pod and answered
    by the other one; it moves once, and no retry is counted (no pod failed)."""
    scheduler = FirstEndpointScheduler()
    app = make_app(scheduler=scheduler)
    flow = _WaiterMoves()
    async with app_client(app) as client:
        object.__setattr__(app.state.gateway.director, "snapshots", flow)
        resp = await client.post("/v1/chat/completions", json=chat_body())
        await _settle(app)
        metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200 and len(fleet.pods[POD_B].requests) == 1
    assert flow.prepared == [(POD_A, True), (POD_B, False)]
    assert [d.endpoint.url for d in scheduler.released] == [POD_A, POD_B]
    assert "llamafleet_router_upstream_retries_total 0.0" in metrics
    assert app.state.gateway.in_flight.total() == 0 and not fleet.pods[POD_A].requests


async def test_a_waiter_whose_idle_pod_is_gone_goes_back_to_the_building_pod(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """Only the building pod serves the model by the time it is scheduled again: rather than a 503, the
    request goes back there (and may not move a second time)."""
    fleet.pods.pop(POD_B)
    app = make_app(scheduler=FirstEndpointScheduler())
    flow = _WaiterMoves()
    async with app_client(app) as client:
        object.__setattr__(app.state.gateway.director, "snapshots", flow)
        resp = await client.post("/v1/chat/completions", json=chat_body())
        await _settle(app)
    assert resp.status_code == 200 and flow.prepared == [(POD_A, True), (POD_A, False)]
    assert app.state.gateway.in_flight.total() == 0


async def test_503_when_every_pod_refuses_the_connection(make_app: AppFactory, fleet: FakeFleet) -> None:
    for pod in fleet.pods.values():
        pod.refuse_inference = True
    app = make_app(scheduler=FirstEndpointScheduler())
    async with app_client(app) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_pod_available"
    assert app.state.gateway.in_flight.total() == 0


async def test_stream_ends_with_sse_error_event_when_upstream_fails_midway(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    for pod in fleet.pods.values():
        pod.stream_mode = {"fail_after": 2}
    app = make_app()
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        await _settle(app)
        metrics = (await client.get("/metrics")).text
    chunks = sse_chunks()
    assert resp.status_code == 200
    assert resp.content.startswith(chunks[0] + chunks[1])
    last = resp.content.strip().split(b"\n")[-1]
    assert last.startswith(b"data: ")
    assert json.loads(last[6:])["error"]["code"] == "upstream_error"
    assert "llamafleet_router_stream_errors_total 1.0" in metrics
    assert app.state.gateway.in_flight.total() == 0


async def test_client_disconnect_mid_stream_releases_lease_and_in_flight(
    make_app: AppFactory, fleet: FakeFleet, leases: InMemorySlotLeases
) -> None:
    """The client goes away while the pod is still generating: the upstream request is closed (llama-server
    stops), the slot lease is released and the in-flight count returns to zero."""
    for pod in fleet.pods.values():
        pod.stream_mode = {"hang_after": 2}
    app = make_app()
    gateway = app.state.gateway
    async with serve(app) as base:
        async with (
            httpx.AsyncClient(base_url=base) as client,
            client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as resp,
        ):
            first = await resp.aiter_raw().__anext__()
            assert first
            assert gateway.in_flight.total() == 1
            stream = next(s for p in fleet.pods.values() for s in p.streams)
            assert not stream.closed.is_set()
            pod = next(p for p in fleet.pods.values() if p.requests)
            slot = pod.requests[0]["body"]["id_slot"]
            pods = await gateway.discovery.endpoints()
            uid = next(s.endpoint.uid for s in pods if s.endpoint.url == pod.url)
            assert await leases.holder(SlotRef(uid, slot)) is not None
        await asyncio.wait_for(stream.closed.wait(), 5.0)
        for _ in range(100):
            if gateway.in_flight.total() == 0 and not len(gateway.tasks):
                break
            await asyncio.sleep(0.02)
        await _settle(app)
    assert gateway.in_flight.total() == 0
    assert await leases.holder(SlotRef(uid, slot)) is None
    assert gateway.metrics.registry.get_sample_value("llamafleet_router_client_disconnects_total") == 1


async def test_completions_and_messages_are_forwarded_to_their_own_route(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    anthropic = {"model": "tiny", "max_tokens": 4, "system": "be brief",
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    async with app_client(make_app(scheduler=FirstEndpointScheduler())) as client:
        done = await client.post("/v1/completions", json={"model": "tiny", "prompt": "once upon a time"})
        msg = await client.post("/v1/messages", json=anthropic)
    assert done.status_code == 200 and msg.status_code == 200
    sent = fleet.pods[POD_A].requests
    assert [r["path"] for r in sent] == ["/v1/completions", "/v1/messages"]
    assert sent[1]["body"]["system"] == "be brief" and sent[1]["body"]["id_slot"] == 0


async def test_wrong_index_entry_is_dropped_when_server_reuses_nothing(
    make_app: AppFactory, fleet: FakeFleet, index: InMemoryPrefixIndex
) -> None:
    """The index predicted the slot held the prompt; llama-server's cache_n says ~0: counted as a false
    hit, and the entry now reflects what the slot really holds (this prompt), not the stale claim."""
    for pod in fleet.pods.values():
        pod.timings = {"cache_n": 0, "prompt_n": 500, "predicted_n": 1}
    app = make_app()
    gateway = app.state.gateway
    async with app_client(app) as client:
        parsed = parse_request(Route.CHAT, json.dumps(chat_body()).encode())
        source = props_for("tiny", await gateway.discovery.endpoints())
        assert source is not None
        blocks = gateway.prompts.identity(parsed, "tiny", source.props).blocks
        uids = [s.endpoint.uid for s in await gateway.discovery.endpoints()]
        for uid in uids:  # every slot claims the prefix, so the decision must predict a hit
            for slot in range(2):
                await index.record_slot("tiny", SlotRef(uid, slot), blocks, 100)
        resp = await client.post("/v1/chat/completions", json=chat_body())
        await gateway.tasks.drain(5.0)
    assert resp.status_code == 200
    reg = gateway.metrics.registry
    assert reg.get_sample_value("llamafleet_router_cache_predictions_total", {"outcome": "false_hit"}) == 1
    assert reg.get_sample_value("llamafleet_router_predicted_cached_tokens_total", {"model": "tiny"}) > 0
    assert reg.get_sample_value("llamafleet_router_actual_cached_tokens_total", {"model": "tiny"}) == 0


async def test_a_patched_servers_shared_tokens_are_counted_by_where_they_came_from(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    """A patched server splits its reuse: `attached_n` from another slot's cells, `prefix_n` from a RAM
    prefix entry. The gateway counts both beside `cache_n`; an upstream answer (neither) counts none."""
    for pod in fleet.pods.values():
        pod.timings = {"cache_n": 900, "prompt_n": 40, "predicted_n": 1, "attached_n": 600, "prefix_n": 300}
    app = make_app()
    gateway = app.state.gateway
    async with app_client(app) as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
        await gateway.tasks.drain(5.0)
        for pod in fleet.pods.values():
            pod.timings = {"cache_n": 900, "prompt_n": 40, "predicted_n": 1}
        again = await client.post("/v1/chat/completions", json=chat_body())
        await gateway.tasks.drain(5.0)
    assert resp.status_code == 200 and again.status_code == 200
    reg = gateway.metrics.registry
    shared = "llamafleet_router_server_shared_tokens_total"
    assert reg.get_sample_value(shared, {"model": "tiny", "source": "attached"}) == 600
    assert reg.get_sample_value(shared, {"model": "tiny", "source": "ram_prefix"}) == 300
    assert reg.get_sample_value("llamafleet_router_actual_cached_tokens_total", {"model": "tiny"}) == 1800


"""What the per-request metrics observe, over a fake fleet (the real-server figures are in
tests/local/test_request_metrics_real.py): one client-side TTFT and one latency per successful answer,
streamed or not, the generated tokens the pod reports, and nothing for an answer the pod refused."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llamafleet_router.inprocess import app_client
from tests.router.conftest import POD_A, AppFactory, chat_body
from tests.router.fakes import TIMINGS, FakeFleet, FirstEndpointScheduler

P = "llamafleet_router_"
MINE = {"model": "tiny", "key": "anonymous"}


async def _values(client: httpx.AsyncClient) -> dict[str, float]:
    """The samples of the metrics this test reads, labelled like `MINE` (the upstream TTFT: by model)."""
    text = (await client.get("/metrics")).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == "tiny" and sample.labels.get("key", "anonymous") == "anonymous":
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def test_each_successful_answer_is_timed_once_and_its_tokens_counted(
    make_app: AppFactory, fleet: FakeFleet
) -> None:
    async with app_client(make_app(scheduler=FirstEndpointScheduler())) as client:
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as resp:
            assert resp.status_code == 200
            await resp.aread()
        answered = await _values(client)
        fleet.pods[POD_A].status = 400
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 400
        refused = await _values(client)

    assert answered[P + "ttft_seconds_count"] == answered[P + "request_seconds_count"] == 2
    assert answered[P + "upstream_ttft_seconds_count"] == 2
    # The client's wait starts before the upstream's and ends with it or after it.
    assert answered[P + "ttft_seconds_sum"] >= answered[P + "upstream_ttft_seconds_sum"]
    assert answered[P + "request_seconds_sum"] >= answered[P + "ttft_seconds_sum"]
    assert answered[P + "output_tokens_total"] == 2 * TIMINGS["predicted_n"]
    for name in ("ttft_seconds_count", "request_seconds_count", "output_tokens_total"):
        assert refused[P + name] == answered[P + name], name

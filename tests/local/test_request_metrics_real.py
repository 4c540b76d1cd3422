"""The gateway's per-request metrics on real requests through `llamafleet up`, read from /metrics with
the admin key: the client-side TTFT (`ttft_seconds`, from the request's arrival) beside the upstream
one, end-to-end latency (`request_seconds`) and generated tokens (`output_tokens_total`), by model and
key name. Each figure is the difference of two scrapes around one request of the key `meter`.
"""

from __future__ import annotations

import time

import openai
import pytest

from llamafleet_testbed.workload import WorkloadSpec, make_profile
from tests.local.sdk_bed import KEYS, MODEL, Metrics, anthropic_client, openai_client
from tests.local.up_bed import Up

pytestmark = [pytest.mark.llama, pytest.mark.redis]

P = "llamafleet_router_"
KEY = "meter"
#: An agent-shaped session prefix (tools and a system prompt) no other test sends: first sight builds it.
SPEC = WorkloadSpec(prefix_chars=12_000, seed=31, workspace="/home/dev/metrics")


def delta(before: Metrics, after: Metrics, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def test_client_ttft_includes_the_first_sight_build_and_tokens_are_counted(sdk_up: Up) -> None:
    """A streamed agent request whose prefix the fleet never saw: the gateway builds it (first sight)
    before forwarding, so the client-side TTFT is at least the upstream TTFT plus that build; the
    end-to-end latency is at least the TTFT and at most what the client measured; the generated tokens
    counted are those the SDK reports. Labels name the key, never the key itself."""
    client = openai_client(sdk_up, KEY)
    body = make_profile(SPEC).request(MODEL, "Please list the files in the workspace.", max_tokens=8)
    before = Metrics(sdk_up)
    started = time.perf_counter()
    with client.chat.completions.with_streaming_response.create(**body) as response:
        action = response.headers.get("x-llamafleet-action")
        chunks = list(response.parse())
    elapsed = time.perf_counter() - started
    after = Metrics(sdk_up)
    assert action == "compute/first_sight", action
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens >= 1

    mine = {"model": MODEL, "key": KEY}
    assert delta(before, after, P + "ttft_seconds_count", **mine) == 1
    assert delta(before, after, P + "request_seconds_count", **mine) == 1
    client_ttft = delta(before, after, P + "ttft_seconds_sum", **mine)
    upstream_ttft = delta(before, after, P + "upstream_ttft_seconds_sum", model=MODEL)
    build = delta(before, after, P + "snapshot_first_sight_seconds_sum")
    assert build > 0 and upstream_ttft > 0
    assert client_ttft >= upstream_ttft + build, (client_ttft, upstream_ttft, build)
    end_to_end = delta(before, after, P + "request_seconds_sum", **mine)
    assert client_ttft <= end_to_end <= elapsed, (client_ttft, end_to_end, elapsed)
    assert delta(before, after, P + "output_tokens_total", **mine) == usage.completion_tokens

    assert any(dict(labels).get("key") == KEY for _, labels in after.values)
    assert not [name for name, key in KEYS.items() if key in after.text]


def test_every_answer_is_timed_and_counted_and_refusals_are_not(sdk_up: Up) -> None:
    """An unstreamed chat answer and a streamed Anthropic message each add one TTFT (at least the
    upstream one) and one latency observation, and their generated tokens; a request the gateway
    refuses (400) adds none of them."""
    prompt = [{"role": "user", "content": "Name one colour."}]
    before = Metrics(sdk_up)
    plain = openai_client(sdk_up, KEY).chat.completions.create(model=MODEL, messages=prompt, max_tokens=6,
                                                               temperature=0)
    middle = Metrics(sdk_up)
    with anthropic_client(sdk_up, KEY).messages.stream(model=MODEL, messages=prompt, max_tokens=6,
                                                       extra_body={"temperature": 0}) as stream:
        message = stream.get_final_message()
    after = Metrics(sdk_up)

    mine = {"model": MODEL, "key": KEY}
    for start, end, generated in ((before, middle, plain.usage.completion_tokens if plain.usage else -1),
                                  (middle, after, message.usage.output_tokens)):
        assert delta(start, end, P + "ttft_seconds_count", **mine) == 1
        assert delta(start, end, P + "request_seconds_count", **mine) == 1
        assert delta(start, end, P + "ttft_seconds_sum", **mine) >= delta(
            start, end, P + "upstream_ttft_seconds_sum", model=MODEL) > 0
        assert delta(start, end, P + "output_tokens_total", **mine) == generated >= 1

    with pytest.raises(openai.BadRequestError, match="grammar"):
        openai_client(sdk_up, KEY).chat.completions.create(model=MODEL, messages=prompt, max_tokens=2,
                                                           extra_body={"grammar": "root ::= \"x\""})
    refused = Metrics(sdk_up)
    for name in ("ttft_seconds_count", "request_seconds_count", "output_tokens_total"):
        assert delta(after, refused, P + name, **mine) == 0, name
    assert delta(after, refused, P + "requests_total", key=KEY, status="400") == 1

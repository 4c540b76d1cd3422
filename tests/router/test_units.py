"""Pure parts: SSE tap, statistics extraction, prediction verdicts, settings, API keys, Anthropic shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llamafleet_router.access.auth import ApiKeys, authenticate, parse_key_lines
from llamafleet_router.api.anthropic import to_chat_body
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.errors import ApiError
from llamafleet_router.inprocess import app_client
from llamafleet_router.proxy.sse import SSETap, Stats, stats_from
from llamafleet_router.request.after import judge
from llamafleet_router.settings import RouterSettings
from tests.router.fakes import sse_chunks


def test_sse_tap_reads_final_timings_when_lines_split_across_chunks() -> None:
    tap = SSETap()
    for chunk in sse_chunks({"cache_n": 7, "prompt_n": 3, "predicted_n": 2}):
        tap.feed(chunk)
    tap.close()
    assert tap.stats == Stats(7, 3, 2) and tap.stats.n_tokens == 12


def test_sse_tap_handles_crlf_split_between_chunks_byte_by_byte() -> None:
    raw = b'data: {"timings": {"cache_n": 5, "prompt_n": 1}}\r\n\r\ndata: [DONE]\r\n\r\n'
    tap = SSETap()
    for i in range(len(raw)):
        tap.feed(raw[i : i + 1])
    tap.close()
    assert tap.stats == Stats(5, 1, None)


def test_sse_tap_flags_error_events() -> None:
    tap = SSETap()
    tap.feed(b'data: {"error": {"message": "boom"}}\n\n')
    assert tap.saw_error and tap.stats is None


def test_stats_from_usage_when_no_timings() -> None:
    openai = {"usage": {"prompt_tokens": 77, "completion_tokens": 4,
                        "prompt_tokens_details": {"cached_tokens": 76}}}
    assert stats_from(openai) == Stats(76, 1, 4)
    anthropic = {"type": "message_start",
                 "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 90,
                                       "output_tokens": 1}}}
    assert stats_from(anthropic) == Stats(90, 10, 1)
    both = {"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 2}},
            "timings": {"cache_n": 3, "prompt_n": 7, "predicted_n": 1}}
    assert stats_from(both) == Stats(3, 7, 1)


def test_anthropic_stream_stats_take_the_generated_count_from_message_delta() -> None:
    """llama-server's Anthropic stream says `output_tokens: 0` in `message_start` and the real count in
    `message_delta`, alone in its usage: the tap ends with both halves."""
    tap = SSETap()
    tap.feed(b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
             b'{"cache_read_input_tokens": 90, "input_tokens": 10, "output_tokens": 0}}}\n\n'
             b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, '
             b'"usage": {"output_tokens": 6}}\n\n'
             b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
    assert tap.finished and tap.stats == Stats(90, 10, 6)


def test_stats_keep_the_prompt_time_from_timings_across_events() -> None:
    """`prompt_ms` (what the cost model learns from) comes from `timings` only, and a later event
    without it (usage alone) keeps it."""
    first = stats_from({"timings": {"cache_n": 3, "prompt_n": 7, "prompt_ms": 12.5}})
    assert first == Stats(3, 7, None, 12.5)
    assert stats_from({"usage": {"completion_tokens": 4}}, first) == Stats(3, 7, 4, 12.5)
    assert stats_from({"timings": {"prompt_ms": True}}) == Stats()  # not a number


@pytest.mark.parametrize(
    ("predicted", "cache_n", "verdict"),
    [(4, 300, "hit"), (4, 3, "false_hit"), (0, 300, "surprise_hit"), (0, 3, "miss"), (1, 0, "false_hit")],
)
def test_judge_compares_prediction_with_server_cache_n(predicted: int, cache_n: int, verdict: str) -> None:
    assert judge(predicted, cache_n, block_tokens=64) == verdict


def test_settings_parse_pods_and_pick_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFLEET_ROUTER_PODS", "http://a:1, http://b:2|http://b:3/")
    settings = RouterSettings()
    assert settings.pod_specs == [PodSpec("http://a:1"), PodSpec("http://b:2", "http://b:3")]
    assert settings.index == "memory"
    assert RouterSettings(redis_url="redis://r:6379").index == "redis"
    with pytest.raises(ValidationError):
        RouterSettings(index="redis")
    with pytest.raises(ValidationError):
        RouterSettings(pods=["ftp://x"])


def test_a_redis_url_the_index_cannot_use_fails_at_start_without_showing_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llamafleet_router.cli import main

    with pytest.raises(ValidationError):
        RouterSettings(redis_url="redis://r:6379/0?socket_timeout=3")
    assert main(["--redis", "redis://:hunter2@r:6379/zero"]) == 2
    out = capsys.readouterr().out
    assert "redis_url" in out and "bad Redis URL" in out and "hunter2" not in out


def test_api_keys_file_lines_need_a_name_and_are_stored_hashed(tmp_path: Path) -> None:
    assert parse_key_lines(["# comment", "", "ci: sk-1 ", "dev:sk:with:colons"]) == [
        ("ci", "sk-1"), ("dev", "sk:with:colons")]
    with pytest.raises(ValueError):
        parse_key_lines(["sk-no-name"])
    path = tmp_path / "keys"
    path.write_text("ci:sk-1\n")
    keys = ApiKeys.from_settings(RouterSettings(api_keys_file=path))
    assert "sk-1" not in repr(keys)
    assert authenticate(keys, {"authorization": "Bearer sk-1"}) == "ci"
    with pytest.raises(ApiError) as err:
        authenticate(keys, {"authorization": "Basic sk-1"})
    assert err.value.status == 401


def test_anthropic_body_becomes_chat_shape() -> None:
    body = {
        "model": "m", "system": [{"type": "text", "text": "be brief"}],
        "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": "/"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a b"}]},
        ],
    }
    chat = to_chat_body(body)
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    call = chat["messages"][2]["tool_calls"][0]["function"]
    assert call == {"name": "ls", "arguments": json.dumps({"p": "/"})}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "a b"}
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}


async def test_health_is_unavailable_until_the_embedders_readiness_says_ready(make_app: Any) -> None:
    """An embedder's readiness condition (all pods up, all prefixes warm) gates /health's 200."""
    state = {"ready": False}

    async def readiness() -> tuple[bool, dict[str, Any]]:
        return state["ready"], {"prefixes_warm": state["ready"]}

    app = make_app(readiness=readiness)
    async with app_client(app) as client:
        first = await client.get("/health")
        state["ready"] = True
        second = await client.get("/health")
    assert first.status_code == 503 and first.json()["fleet"] == {"prefixes_warm": False}
    assert second.status_code == 200 and second.json()["status"] == "ok"

"""Large unstreamed answers: their statistics are read from the keys at their end, as a whole parse
would read them, without building the whole answer as Python objects."""

from __future__ import annotations

import json
import tracemalloc

from llamafleet_router.proxy.sse import Stats, stats_from_body


def answer(tokens: int, **tail: object) -> bytes:
    """An OpenAI chat answer with logprobs of `tokens` tokens, `tail` keys last (as llama-server)."""
    entry = {"id": 1, "token": "x", "bytes": [120], "logprob": -0.5,
             "top_logprobs": [{"id": 2, "token": "y", "bytes": [121], "logprob": -1.5}] * 4}
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": 'say "timings": {}'},
                         "logprobs": {"content": [entry] * tokens}}], **tail}
    return json.dumps(body).encode()


def test_a_large_answer_gives_the_statistics_of_its_last_keys() -> None:
    timings = {"cache_n": 7, "prompt_n": 5, "predicted_n": 3, "prompt_ms": 2.5}
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 7}}
    small, large = answer(2, usage=usage, timings=timings), answer(20_000, usage=usage, timings=timings)
    assert len(large) > 4 * 1024 * 1024
    assert stats_from_body(large) == stats_from_body(small) == Stats(7, 5, 3, 2.5)
    anthropic = {"input_tokens": 4, "output_tokens": 2, "cache_read_input_tokens": 9}
    assert stats_from_body(answer(20_000, usage=anthropic)) == Stats(9, 4, 2)
    assert stats_from_body(answer(20_000)) is None
    assert stats_from_body(answer(20_000)[:-3] + b'"timings":{"cache_n":') is None  # cut off: no figures


def test_a_large_answer_is_not_parsed_whole() -> None:
    body = answer(20_000, timings={"cache_n": 1})
    tracemalloc.start()
    try:
        assert stats_from_body(body) == Stats(1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(body) // 4, f"{peak} bytes allocated to read the statistics of {len(body)}"

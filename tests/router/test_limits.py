"""The per-key limiter (`limits.py`) on a fake clock: token buckets for requests and tokens per minute,
the in-flight count, per-key overrides, what a refusal spends (nothing) and what a request is charged."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llamafleet_router.access.limits import KeyLimiter, LimitConfig, PerKey, Permit, Refusal
from llamafleet_router.api.limited import charged_tokens, limiter_from_settings
from llamafleet_router.settings import RouterSettings


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(clock: FakeClock, *, rpm: tuple[str, ...] = (), tpm: tuple[str, ...] = (),
            concurrent: tuple[str, ...] = ()) -> KeyLimiter:
    return KeyLimiter(LimitConfig(PerKey.parse(rpm), PerKey.parse(tpm), PerKey.parse(concurrent)), clock)


def test_per_key_parses_a_default_and_overrides_and_refuses_anything_else() -> None:
    limit = PerKey.parse(["600", "batch:6000", " free : 10 ", ""])
    assert (limit.of("anyone"), limit.of("batch"), limit.of("free")) == (600, 6000, 10)
    assert PerKey.parse(["batch:5"]).of("other") == 0 and PerKey.parse(["batch:5"]).enabled
    assert not PerKey.parse([]).enabled and not PerKey.parse(["0", "x:0"]).enabled
    for bad in ("many", "x:-1", ":5", "x:1.5", "-3"):
        with pytest.raises(ValueError):
            PerKey.parse([bad])
    with pytest.raises(ValidationError):
        RouterSettings(key_requests_per_minute=["alice:lots"])
    settings = RouterSettings.model_validate({"key_requests_per_minute": "60,batch:600",
                                             "key_concurrent_requests": "2"})
    built = limiter_from_settings(settings)
    assert built.enabled and built.config.requests_per_minute.of("batch") == 600
    assert not limiter_from_settings(RouterSettings()).enabled  # off by default


def test_requests_per_minute_refill_evenly_and_a_refusal_says_when_to_retry() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=("3",))
    assert all(isinstance(limits.admit("a", 1), Permit) for _ in range(3))  # a burst of a minute's worth
    refused = limits.admit("a", 1)
    assert isinstance(refused, Refusal) and refused.dimension == "requests" and refused.limit == 3
    assert refused.retry_after_s == pytest.approx(20.0) and refused.retry_after == "20"
    clock.now += 19.9
    assert isinstance(limits.admit("a", 1), Refusal)
    clock.now += 0.2
    assert isinstance(limits.admit("a", 1), Permit)  # retried when told: admitted
    assert isinstance(limits.admit("b", 1), Permit)  # another key has its own allowance


def test_tokens_per_minute_are_charged_up_front_and_a_refusal_spends_nothing() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=("10",), tpm=("1000",))
    assert isinstance(limits.admit("a", 600), Permit)
    refused = limits.admit("a", 600)
    assert isinstance(refused, Refusal) and refused.dimension == "tokens"
    assert refused.retry_after_s == pytest.approx(200 / (1000 / 60))
    # The refused request spent neither tokens nor a request: 9 requests of the minute are left.
    assert isinstance(limits.admit("a", 400), Permit)
    assert sum(isinstance(limits.admit("a", 0), Permit) for _ in range(20)) == 8
    too_large = limits.admit("b", 1001)
    assert isinstance(too_large, Refusal) and "Request too large" in too_large.message


def test_concurrent_requests_are_counted_until_released_once() -> None:
    clock = FakeClock()
    limits = limiter(clock, concurrent=("2", "solo:1"))
    first, second = limits.admit("a", 1), limits.admit("a", 1)
    assert isinstance(first, Permit) and isinstance(second, Permit) and limits.in_flight("a") == 2
    third = limits.admit("a", 1)
    assert isinstance(third, Refusal) and third.dimension == "concurrent" and third.retry_after == "1"
    first.release()
    first.release()  # idempotent: the second release gives back nothing more
    assert limits.in_flight("a") == 1
    assert isinstance(limits.admit("a", 1), Permit) and limits.in_flight("a") == 2
    assert isinstance(limits.admit("solo", 1), Permit) and isinstance(limits.admit("solo", 1), Refusal)


def test_a_request_refused_on_rate_keeps_no_place_in_flight() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=("1",), concurrent=("5",))
    permit = limits.admit("a", 1)
    assert isinstance(permit, Permit) and isinstance(limits.admit("a", 1), Refusal)
    assert limits.in_flight("a") == 1
    permit.release()
    assert limits.in_flight("a") == 0


def test_a_request_is_charged_its_largest_length_bound_or_the_default() -> None:
    assert charged_tokens({"max_tokens": 50}, 1024) == 50
    assert charged_tokens({"max_tokens": 50, "max_completion_tokens": 70}, 1024) == 70
    assert charged_tokens({"n_predict": -1}, 1024) == 1024  # llama-server's unbounded: the default
    assert charged_tokens({"max_tokens": True, "n_predict": "9"}, 1024) == 1024
    assert charged_tokens({}, 256) == 256

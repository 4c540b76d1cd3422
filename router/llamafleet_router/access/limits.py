"""Per-key limits: requests per minute, completion tokens per minute and requests in flight, per API
key name. Pure bookkeeping with an injected clock (no I/O, no framework), so it is tested with a fake one.

- Rates are token buckets: a key may spend a whole minute's allowance at once (a burst) and it refills
  evenly over the minute. A refused request spends nothing, so a client that retries after the
  `retry_after_s` it was told is admitted.
- Tokens are charged up front, when the request is admitted (its `max_tokens`): what it will really
  generate is known only at its end, and a limit that charges afterwards lets a burst through first.
- In flight counts a request from its admission until its `Permit` is released (the gateway's
  finisher, however the response ended); release is idempotent.

The state is this process's: with several gateway replicas each one enforces the limits on its own share
of the traffic, so a key may get up to replicas x limit in all. Keys are the configured names (with auth
off every request is `anonymous`, one key), so the state stays bounded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Clock = Callable[[], float]
Dimension = Literal["requests", "tokens", "concurrent"]


@dataclass(frozen=True, slots=True)
class PerKey:
    """One limit: `default` for every key and `overrides` by key name; 0 means no limit."""

    default: int = 0
    overrides: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, items: Iterable[str]) -> PerKey:
        """`["600", "batch:6000", "free:10"]`: a bare number for every key, `name:N` for one key."""
        default, overrides = 0, {}
        for item in (text.strip() for text in items):
            if not item:
                continue
            name, sep, number = item.rpartition(":")
            if not number.strip().isdigit() or (sep and not name.strip()):
                raise ValueError(f"a per-key limit is `N` or `name:N` with N >= 0: {item!r}")
            if sep:
                overrides[name.strip()] = int(number)
            else:
                default = int(number)
        return cls(default, overrides)

    def of(self, key: str) -> int:
        return self.overrides.get(key, self.default)

    @property
    def enabled(self) -> bool:
        return self.default > 0 or any(n > 0 for n in self.overrides.values())


@dataclass(frozen=True, slots=True)
class LimitConfig:
    requests_per_minute: PerKey = PerKey()
    tokens_per_minute: PerKey = PerKey()
    concurrent: PerKey = PerKey()
    #: Tokens charged for a request that sets no length bound.
    default_tokens: int = 1024

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute.enabled or self.tokens_per_minute.enabled or self.concurrent.enabled


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was not admitted, and when the same request would be."""

    dimension: Dimension
    limit: int
    retry_after_s: float
    message: str

    @property
    def retry_after(self) -> str:
        """The `retry-after` header: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class TokenBucket:
    """`capacity` units, refilled at `capacity` per `period_s`; starts full."""

    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, capacity: int, now: float, period_s: float = 60.0) -> None:
        self.capacity = capacity
        self.rate = capacity / period_s
        self.level = float(capacity)
        self.updated = now

    def wait_for(self, amount: int, now: float) -> float:
        """Seconds until `amount` units are there (0: now); spends nothing."""
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def take(self, amount: int) -> None:
        self.level -= amount


class Permit:
    """One admitted request's place in its key's in-flight count; `release` gives it back once."""

    __slots__ = ("_counts", "_key")

    def __init__(self, counts: dict[str, int] | None, key: str) -> None:
        self._counts, self._key = counts, key

    def release(self) -> None:
        counts, self._counts = self._counts, None
        if counts is None:
            return
        left = counts.get(self._key, 0) - 1
        if left > 0:
            counts[self._key] = left
        else:
            counts.pop(self._key, None)


class KeyLimiter:
    """The limits of every key of one gateway replica."""

    def __init__(self, config: LimitConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}
        self._in_flight: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def in_flight(self, key: str) -> int:
        return self._in_flight.get(key, 0)

    def admit(self, key: str, tokens: int) -> Permit | Refusal:
        """A permit for one request of `key` that may generate `tokens`, or why not. Every limit is
        checked before anything is spent, so a refusal leaves the key's allowances as they were."""
        now = self.clock()
        concurrent = self.config.concurrent.of(key)
        if concurrent > 0 and self.in_flight(key) >= concurrent:
            return Refusal("concurrent", concurrent, 1.0,
                           f"Too many requests in flight for key `{key}`: limit {concurrent} at once.")
        rpm = self.config.requests_per_minute.of(key)
        requests = self._bucket(self._requests, key, rpm, now)
        if requests is not None and (wait := requests.wait_for(1, now)) > 0:
            return Refusal("requests", rpm, wait,
                           f"Rate limit reached for key `{key}` on requests per minute: limit {rpm}.")
        tpm = self.config.tokens_per_minute.of(key)
        bucket = self._bucket(self._tokens, key, tpm, now)
        if bucket is not None:
            if tokens > tpm:
                return Refusal("tokens", tpm, 60.0,
                               f"Request too large for key `{key}` on tokens per minute: limit {tpm}, "
                               f"requested {tokens}; lower `max_tokens`.")
            if (wait := bucket.wait_for(tokens, now)) > 0:
                return Refusal("tokens", tpm, wait,
                               f"Rate limit reached for key `{key}` on tokens per minute: limit {tpm}, "
                               f"requested {tokens}.")
            bucket.take(tokens)
        if requests is not None:
            requests.take(1)
        if concurrent <= 0:
            return Permit(None, key)
        self._in_flight[key] = self.in_flight(key) + 1
        return Permit(self._in_flight, key)

    @staticmethod
    def _bucket(buckets: dict[str, TokenBucket], key: str, limit: int, now: float) -> TokenBucket | None:
        if limit <= 0:
            return None
        bucket = buckets.get(key)
        if bucket is None or bucket.capacity != limit:
            bucket = buckets[key] = TokenBucket(limit, now)
        return bucket

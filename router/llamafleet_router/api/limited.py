"""The per-key limits (`limits.py`) on the request path: what a request is charged, and the 429 it gets
past them, shaped like the API it called (OpenAI's `rate_limit_exceeded`, Anthropic's
`rate_limit_error`), with `retry-after`.
"""

from __future__ import annotations

from typing import Any

from llamafleet_router.access.limits import KeyLimiter, LimitConfig, PerKey, Permit, Refusal
from llamafleet_router.api.parse import ANTHROPIC_ROUTES, DIRECT_ROUTES, Route
from llamafleet_router.errors import ApiError
from llamafleet_router.settings import RouterSettings

# The fields that bound a completion's length, by API: OpenAI's (old and new), llama-server's own.
_LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")


def limiter_from_settings(settings: RouterSettings) -> KeyLimiter:
    return KeyLimiter(LimitConfig(
        requests_per_minute=PerKey.parse(settings.key_requests_per_minute),
        tokens_per_minute=PerKey.parse(settings.key_tokens_per_minute),
        concurrent=PerKey.parse(settings.key_concurrent_requests),
        default_tokens=settings.key_default_max_tokens,
    ))


def charged_tokens(body: dict[str, Any], default: int) -> int:
    """The completion tokens a request may generate: the largest length bound it sets, else `default`
    (also for llama-server's `-1`, unbounded: the field allow-list bounds those)."""
    given = [body.get(name) for name in _LENGTH_FIELDS]
    bounds = [v for v in given if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(bounds) if bounds else default


class RateLimited(ApiError):
    """A 429 with `retry-after`; on `/v1/messages` in Anthropic's error shape."""

    def __init__(self, refusal: Refusal, *, anthropic: bool) -> None:
        super().__init__(429, refusal.message, type="tokens" if refusal.dimension == "tokens" else "requests",
                         code="rate_limit_exceeded", headers={"retry-after": refusal.retry_after})
        self.anthropic = anthropic

    def body(self) -> dict[str, Any]:
        if self.anthropic:
            return {"type": "error", "error": {"type": "rate_limit_error", "message": self.message}}
        return super().body()


def admit(limiter: KeyLimiter, key: str, route: Route, body: dict[str, Any]) -> Permit | None:
    """The request's permit (None when no limit is configured: nothing to give back); RateLimited
    past one of the key's limits."""
    if not limiter.enabled:
        return None
    # Counting tokens and embedding generate nothing: they count as requests, not completion tokens.
    tokens = 0 if route in DIRECT_ROUTES else charged_tokens(body, limiter.config.default_tokens)
    outcome = limiter.admit(key, tokens)
    if isinstance(outcome, Refusal):
        raise RateLimited(outcome, anthropic=route in ANTHROPIC_ROUTES)
    return outcome

"""API keys: `Authorization: Bearer <key>` or `x-api-key: <key>`, each key known by a name.

Keys are kept only as SHA-256 digests and compared with `hmac.compare_digest` against every configured
digest (no early exit), so neither memory dumps nor timing reveal them. Only the key's NAME reaches logs
and metrics. With no key configured auth is off, which `create_app` logs as a warning.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llamafleet_router.errors import AUTHENTICATION, INVALID_REQUEST, ApiError
from llamafleet_router.settings import RouterSettings

#: The key name requests get when auth is off.
ANONYMOUS = "anonymous"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_key_lines(lines: Iterable[str]) -> list[tuple[str, str]]:
    """`name:key` per line; blank lines and `#` comments skipped. A line without a name is rejected so
    that every key has something safe to log."""
    entries: list[tuple[str, str]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition(":")
        if not sep or not name.strip() or not key.strip():
            raise ValueError(f"API key line {number}: expected `name:key`")
        entries.append((name.strip(), key.strip()))
    return entries


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """Configured keys as (digest, name) pairs."""

    entries: tuple[tuple[bytes, str], ...] = ()

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]]) -> ApiKeys:
        return cls(tuple((_digest(key), name) for name, key in pairs))

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> ApiKeys:
        pairs: list[tuple[str, str]] = []
        if settings.api_keys_file is not None:
            pairs += parse_key_lines(Path(settings.api_keys_file).read_text().splitlines())
        if settings.api_keys is not None:
            pairs += parse_key_lines(settings.api_keys.get_secret_value().split(","))
        return cls.from_pairs(pairs)

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def name_of(self, presented: str) -> str | None:
        """The name of the key `presented`, or None. Compares against every entry (constant time)."""
        digest = _digest(presented)
        found: str | None = None
        for known, name in self.entries:
            if hmac.compare_digest(known, digest) and found is None:
                found = name
        return found


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: a Bearer token, else `x-api-key` (what llama-server also accepts)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def authenticate(keys: ApiKeys, headers: Mapping[str, str]) -> str:
    """The key name for this request; raises a 401 ApiError when auth is on and the key is missing or
    wrong. The wrong key itself is never echoed back."""
    if not keys.enabled:
        return ANONYMOUS
    presented = presented_key(headers)
    # OpenAI answers a missing key with `invalid_request_error` and a wrong one with `authentication_error`.
    if presented is None:
        raise ApiError(
            401,
            "You didn't provide an API key. Send it as `Authorization: Bearer <key>` or `x-api-key: <key>`.",
            type=INVALID_REQUEST,
            code="missing_api_key",
        )
    name = keys.name_of(presented)
    if name is None:
        raise ApiError(401, "Incorrect API key provided.", type=AUTHENTICATION, code="invalid_api_key")
    return name

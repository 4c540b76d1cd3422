"""The collaborators every reconcile takes: one object built at operator start-up, kept in kopf's memo."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from pydantic import ValidationError

from llamafleet_core.agent_client import AgentClient
from llamafleet_core.agent_tokens import namespace_token
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.index.redis_conn import RedisLike
from llamafleet_core.warming import WarmResult
from llamafleet_operator.kube import Kube
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.retry import Backoff
from llamafleet_operator.settings import OperatorSettings


class Log(Protocol):
    """What reconcile functions log to: kopf's object logger, or one that also posts events."""

    def debug(self, message: str, /) -> None: ...
    def info(self, message: str, /) -> None: ...
    def warning(self, message: str, /) -> None: ...
    def error(self, message: str, /) -> None: ...


class InvalidSpec(ValueError):
    """The resource's spec cannot be reconciled as written; the message names the field."""


class Forbidden(InvalidSpec):
    """The spec asks for what the admission policy refuses (admission.py); the message names the fields."""


def describe_validation(exc: ValidationError, root: str = "spec") -> str:
    """pydantic's errors as `spec.model.source: set exactly one ...` lines (camelCase field paths)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{root}.{loc}" if loc else root
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return "; ".join(lines)


@dataclass
class Context:
    kube: Kube
    http: httpx.AsyncClient
    settings: OperatorSettings
    agent_token: str = ""
    pod_api_key: str | None = None
    """llama-server's own API key (settings' `pod_api_key_file`), for warming's calls to the servers."""
    prefix_key: bytes = b""
    """The routers' prefix hash key (settings' `resolved_prefix_key`): warming records their hashes."""
    membership_key: bytes = b""
    """The key membership entries are signed with (settings' `resolved_membership_key`); b"": unsigned."""
    redis: RedisLike | None = None
    index: PrefixIndex | None = None
    warm_results: dict[str, tuple[int | str | None, WarmResult]] = field(default_factory=dict)
    """SharedPrefix uid -> (revision, last result): lets a timer tick warm only the pods that are new
    (the revision is the generation, with the text's digest when the text is in a ConfigMap).
    Lost on restart on purpose: the first tick after a restart re-checks every pod (cheap, idempotent)."""

    seed_retries: dict[str, Backoff] = field(default_factory=dict)
    """SharedPrefix uid -> failed builds in a row and when the next may run (retry.py)."""
    clock: Callable[[], float] = time.monotonic

    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def agent_token_for(self, namespace: str) -> str:
        """The token the agents of `namespace` accept: derived from the master (agent_tokens.py)."""
        return namespace_token(self.agent_token, namespace) if self.agent_token and namespace else ""

    def agent_of(self, pod: P.Pod) -> AgentClient:
        """The snapshot agent beside `pod`, called with its namespace's token."""
        return AgentClient(P.warm_pod(pod).agent_url, self.http, self.agent_token_for(P.namespace(pod)))

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    async def close(self) -> None:
        await self.kube.close()
        await self.http.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        if self.index is not None:
            await self.index.close()

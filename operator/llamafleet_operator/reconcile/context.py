"""The collaborators every reconcile takes: one object built at operator start-up, kept in kopf's memo."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import redis.asyncio as aioredis
from pydantic import ValidationError

from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.warming import WarmResult
from llamafleet_operator.kube import Kube
from llamafleet_operator.settings import OperatorSettings


class Log(Protocol):
    """What reconcile functions log to: kopf's object logger, or one that also posts events."""

    def debug(self, message: str, /) -> None: ...
    def info(self, message: str, /) -> None: ...
    def warning(self, message: str, /) -> None: ...
    def error(self, message: str, /) -> None: ...


class InvalidSpec(ValueError):
    """The resource's spec cannot be reconciled as written; the message names the field."""


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
    redis: aioredis.Redis | None = None
    index: PrefixIndex | None = None
    warm_results: dict[str, tuple[int | None, WarmResult]] = field(default_factory=dict)
    """SharedPrefix uid -> (generation, last result): lets a timer tick warm only the pods that are new.
    Lost on restart on purpose: the first tick after a restart re-checks every pod (cheap, idempotent)."""

    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    async def close(self) -> None:
        await self.kube.close()
        await self.http.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        if self.index is not None:
            await self.index.close()

"""Router settings: environment (`LLAMAFLEET_ROUTER_*`), an optional `.env`, or the CLI (which builds them).

Built once in `main()` and passed down; nothing reads settings at import time. Every field carries a `#:`
comment, which is its documentation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llamafleet_core.settings_support import RedisUrl


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One statically configured pod: `url`, `url|agent_url`, or `url|agent_url|attach` for a pod whose
    llama-server runs with the patched `--slot-attach` (an empty agent_url is allowed: `url||attach`)."""

    url: str
    agent_url: str | None = None
    attach: bool = False

    @classmethod
    def parse(cls, text: str) -> PodSpec:
        url, _, rest = text.strip().partition("|")
        agent, _, flag = rest.partition("|")
        url, agent, flag = url.strip().rstrip("/"), agent.strip().rstrip("/"), flag.strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"pod URL must start with http:// or https://: {url!r}")
        if agent and not agent.startswith(("http://", "https://")):
            raise ValueError(f"agent URL must start with http:// or https://: {agent!r}")
        if flag not in ("", "attach"):
            raise ValueError(f"the third field of a pod may only be `attach`: {flag!r}")
        return cls(url, agent or None, flag == "attach")


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLAMAFLEET_ROUTER_", env_nested_delimiter="__", env_ignore_empty=True, extra="ignore"
    )

    #: Address to listen on.
    host: str = "127.0.0.1"
    #: Port to listen on.
    port: int = Field(default=8000, ge=0, le=65535)
    #: Static pods: comma-separated llama-server URLs, each optionally followed by `|agent_url` and then
    #: `|attach` when the pod runs the patched `--slot-attach`.
    pods: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Where the pods come from: `static` (`pods`) or `redis` (the fleet membership the operator writes
    #: to redis_url).
    discovery: Literal["static", "redis"] = "static"
    #: With `discovery=redis`: comma-separated `namespace/name` fleets to serve; all fleets when empty.
    fleets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Model name clients use; by default each pod's `model_alias` (or its model file's basename).
    model_name: str | None = None
    #: Redis URL of the shared prefix index (several router replicas share it).
    redis_url: RedisUrl | None = None
    #: Which prefix index to use: `redis` (needs redis_url) or `memory` (one replica only).
    #: Defaults to `redis` when redis_url is set, otherwise `memory`.
    index: Literal["redis", "memory"] | None = None
    #: Scheduling pipeline YAML; the built-in default pipeline when unset.
    config_file: Path | None = None
    #: Overrides the pipeline's `decision.min_batch_tokens` (the prefill cost model's small-batch cliff:
    #: 64 for CPU pods, 0 for GPU ones; see `llamafleet_core.devices`). Unset: the pipeline's value.
    min_batch_tokens: int | None = Field(default=None, ge=0)
    #: File of API keys, one `name:key` per line (`#` starts a comment).
    api_keys_file: Path | None = None
    #: API keys from the environment: comma-separated `name:key`. Auth is off when no key is configured.
    api_keys: SecretStr | None = None
    #: Largest request body accepted, in bytes; larger bodies get 413.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    #: Characters per prefix block (the unit of prefix matching and of the index).
    block_chars: int = Field(default=256, gt=0)
    #: Rough characters per token, to turn predicted blocks into predicted cached tokens for metrics.
    chars_per_token: float = Field(default=3.5, gt=0)
    #: Seconds to open a connection to a pod; a refused or timed-out connect is retried on another pod.
    connect_timeout: float = Field(default=5.0, gt=0)
    #: Seconds to send the request body to a pod.
    write_timeout: float = Field(default=60.0, gt=0)
    #: Seconds to wait for a free upstream connection from the pool.
    pool_timeout: float = Field(default=30.0, gt=0)
    #: Upper bound of concurrent upstream connections (all pods together).
    max_connections: int = Field(default=1024, gt=0)
    #: How many other pods to try when a pod refuses the connection before anything was streamed.
    retries: int = Field(default=2, ge=0)
    #: Seconds between `/slots` polls of each pod (and `/health` probes of pods marked down).
    poll_interval: float = Field(default=1.0, gt=0)
    #: Seconds without an answer to `/slots` after which a pod counts as hung and is marked down.
    #: Unset: max(3, 4 x poll_interval). llama-server answers between two batches, so on slow hardware
    #: (one batch taking seconds) raise it above one batch's compute time.
    hang_timeout: float | None = Field(default=None, gt=0)
    #: Seconds between pings of the index while it is degraded (and while healthy, to notice an outage).
    index_ping_interval: float = Field(default=2.0, gt=0)
    #: Log level of the router's JSON logs.
    log_level: str = "INFO"
    #: Shared token of the pods' snapshot agents (the router asks them to save, pull and restore
    #: snapshots). Snapshots are off when neither this nor `agent_token_file` is set. Never logged.
    agent_token: SecretStr | None = None
    #: File holding the agents' shared token (first line), used when `agent_token` is unset.
    agent_token_file: Path | None = None
    #: A session prefix (tools, system prompt, history) is snapshotted on first sight only from this many
    #: characters on: shorter ones compute in well under a second anyway.
    first_sight_min_chars: int = Field(default=2048, ge=1)
    #: Seconds a request waits for a concurrent request's first-sight snapshot of the same prefix before
    #: it computes the prefix itself.
    first_sight_wait_s: float = Field(default=120.0, ge=0)
    #: Most stage snapshots (the last line, the paragraphs before it, special tokens) per new session prefix.
    snapshot_stages: int = Field(default=4, ge=0)
    #: Copy a snapshot in the background to a pod whose session would have used it had it been there, so
    #: that the next session of that prefix on that pod restores it without a pull (`snapshots/ship.py`).
    ship_snapshots: bool = True
    #: Load a session prefix just built for the first time into this many idle slots of its pod at once
    #: (never the pod's last idle one), so that the next sessions of a burst find it in a slot instead of
    #: restoring it on their request path (`snapshots/prime.py`); 0 turns this off.
    prime_slots: int = Field(default=2, ge=0, le=64)

    @field_validator("pods", "fleets", mode="before")
    @classmethod
    def _split_pods(cls, value: object) -> object:
        if isinstance(value, str):
            return [part for part in (p.strip() for p in value.split(",")) if part]
        return value

    @field_validator("pods")
    @classmethod
    def _check_pods(cls, value: list[str]) -> list[str]:
        for text in value:
            PodSpec.parse(text)
        return value

    @field_validator("fleets")
    @classmethod
    def _check_fleets(cls, value: list[str]) -> list[str]:
        for text in value:
            namespace, _, name = text.partition("/")
            if not namespace or not name or "/" in name:
                raise ValueError(f"fleet must be `namespace/name`: {text!r}")
        return value

    @model_validator(mode="after")
    def _check_index(self) -> RouterSettings:
        if self.index is None:
            self.index = "redis" if self.redis_url else "memory"
        if self.index == "redis" and not self.redis_url:
            raise ValueError("index=redis needs redis_url")
        if self.discovery == "redis" and not self.redis_url:
            raise ValueError("discovery=redis needs redis_url")
        return self

    def resolved_agent_token(self) -> str | None:
        """The agents' token from `agent_token`, else the first line of `agent_token_file`, else None."""
        if self.agent_token is not None and self.agent_token.get_secret_value():
            return self.agent_token.get_secret_value()
        if self.agent_token_file is not None:
            lines = self.agent_token_file.read_text().strip().splitlines()
            if lines and lines[0].strip():
                return lines[0].strip()
        return None

    @property
    def pod_specs(self) -> list[PodSpec]:
        return [PodSpec.parse(text) for text in self.pods]

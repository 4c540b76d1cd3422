"""Router settings: environment (`LLAMAFLEET_ROUTER_*`), an optional `.env`, or the CLI (which builds them).

Built once in `main()` and passed down; nothing reads settings at import time. Every field carries a `#:`
comment, which is its documentation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llamafleet_core.membership_signing import membership_key
from llamafleet_core.networks import PRIVATE_NETWORKS, split_list
from llamafleet_core.prefix.hashing import prefix_key_bytes
from llamafleet_core.settings_support import ModelFleetList, NetworkList, RedisUrl, secret_text
from llamafleet_router.access.limits import PerKey
from llamafleet_router.access.tenancy import parse_key_groups
from llamafleet_router.discovery.pod_spec import PodSpec

#: What `extra_fields` may name: a JSON field name as llama-server spells its own.
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLAMAFLEET_ROUTER_", env_nested_delimiter="__", env_ignore_empty=True, extra="ignore"
    )

    #: Address to listen on.
    host: str = "127.0.0.1"
    #: Port to listen on.
    port: int = Field(default=8000, ge=0, le=65535)
    #: Gateway processes serving `port` together (SO_REUSEPORT), under a supervisor that restarts them
    #: and alone serves `metrics_port`, merging their metrics (`supervisor/`). Each worker is a replica
    #: of its own (leases, per-key limits, session affinity), so more than 1 needs index=redis.
    workers: int = Field(default=1, ge=1, le=64)
    #: Static pods: comma-separated llama-server URLs, each optionally followed by `|agent_url` and then
    #: `|attach` when the pod runs the patched `--slot-attach`, `|attach+cache-prefix` with
    #: `--cache-prefix` too.
    pods: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Where the pods come from: `static` (`pods`) or `redis` (the fleet membership the operator writes
    #: to redis_url).
    discovery: Literal["static", "redis"] = "static"
    #: With `discovery=redis`: comma-separated `namespace/name` fleets to serve; all fleets when empty.
    fleets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: With `discovery=redis`: comma-separated `model=namespace/name`, the fleet that serves a model name
    #: that several fleets report. Without an entry such a name is refused (503 `model_conflict`, listed
    #: in `/health`): one fleet never receives requests meant for another (`ownership.py`).
    model_fleets: ModelFleetList = Field(default_factory=list)
    #: Model name clients use; by default each pod's `model_alias` (or its model file's basename).
    model_name: str | None = None
    #: Redis URL of the shared prefix index (several router replicas share it).
    redis_url: RedisUrl | None = None
    #: Which prefix index to use: `redis` (needs redis_url) or `memory` (one replica only).
    #: Defaults to `redis` when redis_url is set, otherwise `memory`.
    index: Literal["redis", "memory"] | None = None
    #: Prefix of every Redis key (index, leases, membership): the operator's `index_prefix`. Releases
    #: sharing one Redis need different ones.
    index_prefix: str = Field(default="lf", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    #: Scheduling pipeline YAML; the built-in default pipeline when unset.
    config_file: Path | None = None
    #: Overrides the pipeline's `decision.min_batch_tokens` (the prefill cost model's small-batch cliff:
    #: 64 for CPU pods, 0 for GPU ones; see `llamafleet_core.devices`). Unset: the pipeline's value.
    min_batch_tokens: int | None = Field(default=None, ge=0)
    #: File of API keys, one `name:key` per line (`#` starts a comment).
    api_keys_file: Path | None = None
    #: API keys from the environment: comma-separated `name:key`. Auth is off when no key is configured.
    api_keys: SecretStr | None = None
    #: Names of the API keys that may see the gateway's internals on the client port: the detailed
    #: `/health`, `/metrics`, and the `x-llamafleet-*` routing headers (`tenancy.py`).
    admin_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Send the `x-llamafleet-pod`/`-slot`/`-action`/`-snapshot` headers to every key, not only to admin
    #: keys. They tell whether a prompt's prefix was cached, so any key would learn what others sent:
    #: for single-user fleets (`llamafleet up` turns it on).
    expose_routing_headers: bool = False
    #: Tenant groups, comma-separated `key-name:group`: the keys of a group find only the prefixes their
    #: own group sent in the index (its own hash namespace). Ungrouped keys share one namespace, with the
    #: SharedPrefix snapshots; grouped keys do not find those.
    key_tenants: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Port of a second listener that serves `/metrics` and the detailed `/health` without a key, for
    #: Prometheus and probes; keep it off the Service clients use. Unset: no such listener.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: Largest request body accepted, in bytes; larger bodies get 413.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    #: Largest request head (request line and headers) accepted, in bytes, before the key is checked;
    #: larger heads get 431 and the connection is closed (`transport.py`).
    max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    #: Seconds a client may take to send a request's head, from the connection (or the end of the
    #: previous response) on; then 408 and the connection is closed (slow-loris headers).
    header_timeout_s: float = Field(default=10.0, gt=0)
    #: Seconds a client may take to send the whole request body; then 408 (slow-loris bodies).
    body_timeout_s: float = Field(default=60.0, gt=0)
    #: Largest non-streamed answer (or error body) read from a pod, in bytes; a larger one is cut off
    #: and the client gets a 502 (streamed answers are relayed chunk by chunk and never held whole).
    max_response_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    #: Requests per minute per API key name, comma-separated: a number for every key and `name:N` for
    #: one key (0 or empty: no limit). Counted per gateway replica (each of `workers` is one); past it
    #: 429 with `retry-after`.
    key_requests_per_minute: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Completion tokens per minute per API key name (same form): each request is charged its
    #: `max_tokens` (or `key_default_max_tokens`) when it is admitted. Per replica.
    key_tokens_per_minute: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Requests in flight (streams included) per API key name at once (same form). Per replica.
    key_concurrent_requests: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Tokens charged to `key_tokens_per_minute` for a request that sets no `max_tokens`.
    key_default_max_tokens: int = Field(default=1024, ge=1)
    #: Most completion tokens one request may ask for, comma-separated: a number for every key and
    #: `name:N` for one key (0: no bound). A larger `max_tokens`, `max_completion_tokens` or `n_predict`
    #: is lowered to it, and a request that sets none is sent with it (`api/fields.py`).
    max_tokens_per_request: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["32768"])
    #: Most completions one request may ask for (`n`, `best_of`). llama-server runs the others in
    #: other idle slots, outside the gateway's leases (evicting their prefixes): keep 1 on shared pods.
    max_n: int = Field(default=1, ge=1, le=64)
    #: Most alternatives per token a request may ask for (`top_logprobs`, `logprobs`, `n_probs`).
    max_logprobs: int = Field(default=20, ge=0, le=1000)
    #: Most messages in one request; more get 400 (rendering a prompt costs CPU per message).
    max_messages: int = Field(default=10_000, ge=1)
    #: Most content parts (Anthropic: blocks) in all messages of one request together; more get 400.
    max_content_parts: int = Field(default=50_000, ge=1)
    #: Most tools in one request; more get 400.
    max_tools: int = Field(default=512, ge=0)
    #: Deepest nesting of objects and arrays in a request body (the body is level 1); deeper gets 400
    #: (at most 200: the encoder of forwarded bodies stops at 255).
    max_json_depth: int = Field(default=64, ge=8, le=200)
    #: Request fields to forward beyond the allow-list of `api/fields.py`, comma-separated: `name` for
    #: every key, `key:name` for one key (e.g. `grammar`, `batch:lora`). Others get 400 naming them.
    extra_fields: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Secret key of the index's prefix hashes, so that whoever reads Redis cannot test guessed prompts
    #: against them. Routers and the operator (SharedPrefix warming) of one index need the same one.
    #: Unset (and no `prefix_key_file`): unkeyed hashes. Never logged.
    prefix_key: SecretStr | None = None
    #: File holding the prefix hash key (its first line), used when `prefix_key` is unset.
    prefix_key_file: Path | None = None
    #: With discovery=redis: the key the operator signs fleet membership entries with (the operator's
    #: `membership_key`). Set: entries without a right signature for their fleet are ignored (logged,
    #: counted). Unset (and no `membership_key_file`): entries are not checked. Never logged.
    membership_key: SecretStr | None = None
    #: File holding the membership key (its first line), used when `membership_key` is unset.
    membership_key_file: Path | None = None
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
    #: llama-server's own API key (the pods' `--api-key`, a fleet's `apiKeySecretRef`): sent on every
    #: call to a pod (discovery's polls, forwarded requests, first-sight prefills). Unset: pods have none.
    #: Never logged.
    pod_api_key: SecretStr | None = None
    #: File holding the pods' API key (first line), used when `pod_api_key` is unset.
    pod_api_key_file: Path | None = None
    #: With discovery=redis: comma-separated networks (CIDR) that member addresses must lie in. A member
    #: whose address is not an IP literal inside them is ignored (logged, counted): whoever can write
    #: Redis must not choose where prompts and the agent token go. Default: the private ranges.
    member_networks: NetworkList = Field(default_factory=lambda: list(PRIVATE_NETWORKS))
    #: A session prefix (tools, system prompt, history) is snapshotted on first sight only from this many
    #: characters on: shorter ones compute in well under a second anyway.
    first_sight_min_chars: int = Field(default=2048, ge=1)
    #: The most seconds a request waits for a concurrent request's first-sight build of the same head
    #: before it computes the head itself. Within it, the wait follows the build's expected time: the
    #: head's tokens over the building pod's learned prefill rate (an unknown pod: a slow CPU figure,
    #: `snapshots/waits.py` UNKNOWN_POD_PREFILL_TOKENS_PER_S), times 2 plus 5 s, and at least
    #: `first_sight_wait_min_s`; counted from the build's start. The default is the build's own
    #: prefill timeout, past which the leader gives up too.
    first_sight_wait_s: float = Field(default=900.0, ge=0)
    #: The least seconds such a wait lasts, however fast the build is expected to be (a pod busy with
    #: other slots' batches prefills slower than it has learned).
    first_sight_wait_min_s: float = Field(default=10.0, ge=0)
    #: Most stage snapshots (the last line, the paragraphs before it, special tokens) per new session prefix.
    snapshot_stages: int = Field(default=4, ge=0)
    #: Copy a snapshot in the background to a pod whose session would have used it had it been there, so
    #: that the next session of that prefix on that pod restores it without a pull (`snapshots/ship.py`).
    ship_snapshots: bool = True
    #: Load a session prefix just built for the first time into this many idle slots of its pod at once
    #: (never the pod's last idle one), so that the next sessions of a burst find it in a slot instead of
    #: restoring it on their request path (`snapshots/prime.py`); 0 turns this off.
    prime_slots: int = Field(default=2, ge=0, le=64)

    @field_validator("pods", "fleets", "key_requests_per_minute", "key_tokens_per_minute",
                     "key_concurrent_requests", mode="before")
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

    @field_validator("key_requests_per_minute", "key_tokens_per_minute", "key_concurrent_requests")
    @classmethod
    def _check_key_limits(cls, value: list[str]) -> list[str]:
        PerKey.parse(value)
        return value

    @field_validator("max_tokens_per_request", "extra_fields", mode="before")
    @classmethod
    def _split_field_bounds(cls, value: object) -> object:
        return split_list(value)

    @field_validator("max_tokens_per_request")
    @classmethod
    def _check_max_tokens(cls, value: list[str]) -> list[str]:
        PerKey.parse(value)
        return value

    @field_validator("extra_fields")
    @classmethod
    def _check_extra_fields(cls, value: list[str]) -> list[str]:
        for item in value:  # the form `api.fields.ExtraFields.parse` reads
            key, sep, name = item.rpartition(":")
            if not FIELD_NAME.fullmatch(name.strip()) or (sep and not key.strip()):
                raise ValueError(f"an extra field is `name` or `key:name`: {item!r}")
        return value

    @field_validator("fleets")
    @classmethod
    def _check_fleets(cls, value: list[str]) -> list[str]:
        for text in value:
            namespace, _, name = text.partition("/")
            if not namespace or not name or "/" in name:
                raise ValueError(f"fleet must be `namespace/name`: {text!r}")
        return value

    @field_validator("admin_keys", "key_tenants", mode="before")
    @classmethod
    def _split_tenancy(cls, value: object) -> object:
        return split_list(value)

    @field_validator("key_tenants")
    @classmethod
    def _check_key_tenants(cls, value: list[str]) -> list[str]:
        parse_key_groups(value)
        return value

    @model_validator(mode="after")
    def _check_index(self) -> RouterSettings:
        if self.index is None:
            self.index = "redis" if self.redis_url else "memory"
        if self.index == "redis" and not self.redis_url:
            raise ValueError("index=redis needs redis_url")
        if self.discovery == "redis" and not self.redis_url:
            raise ValueError("discovery=redis needs redis_url")
        if self.workers > 1 and self.index != "redis":
            raise ValueError(f"workers={self.workers} needs index=redis (redis_url): with the memory "
                             "index each worker would route by a private index and private slot leases, "
                             "and two workers would pin requests to one slot")
        return self

    def resolved_agent_token(self) -> str | None:
        """The agents' token from `agent_token`, else the first line of `agent_token_file`, else None."""
        return secret_text(self.agent_token, self.agent_token_file) or None

    def resolved_pod_api_key(self) -> str | None:
        """The pods' API key from `pod_api_key`, else the first line of `pod_api_key_file`, else None."""
        return secret_text(self.pod_api_key, self.pod_api_key_file) or None

    def resolved_membership_key(self) -> bytes:
        """The membership signing key (`membership_key`, else `membership_key_file`); b"": unchecked."""
        return membership_key(secret_text(self.membership_key, self.membership_key_file))

    def resolved_prefix_key(self) -> bytes:
        """The prefix hash key (`prefix_key`, else the first line of `prefix_key_file`); b"": unkeyed."""
        return prefix_key_bytes(secret_text(self.prefix_key, self.prefix_key_file))

    @property
    def pod_specs(self) -> list[PodSpec]:
        return [PodSpec.parse(text) for text in self.pods]

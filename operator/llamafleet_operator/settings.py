"""Operator settings (environment prefix `LLAMAFLEET_OPERATOR_`), read once at start-up.

They reach handlers through kopf's `memo` (no module-level state): `cli.main` builds them, `startup`
turns them into clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llamafleet_core.membership_signing import membership_key
from llamafleet_core.model_fleets import parse_model_fleets
from llamafleet_core.networks import check_networks
from llamafleet_core.prefix.hashing import prefix_key_bytes
from llamafleet_core.settings_support import ModelFleetList, RedisUrl, secret_text
from llamafleet_operator.reconcile.admission import DEFAULT_EXTRA_ARGS, AdmissionPolicy
from llamafleet_operator.release import default_agent_image

PEER_KEYS = frozenset({"podSelector", "namespaceSelector", "ipBlock"})


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLAMAFLEET_OPERATOR_", extra="ignore")

    namespaces: list[str] = Field(default_factory=list)
    """Namespaces to serve (globs allowed); empty means cluster-wide."""
    kubeconfig: str | None = None
    """A kubeconfig file for the operator's own client; unset: in-cluster credentials, else $KUBECONFIG."""
    redis_url: RedisUrl | None = None
    """The prefix index and fleet membership. Unset: snapshots are warmed but not indexed, and routers
    in the cluster get no membership (they would need static discovery)."""
    index_prefix: str = "lf"
    """Prefix of every Redis key (index, membership); the routers' `index_prefix` must be the same."""
    prefix_key: SecretStr | None = None
    prefix_key_file: Path | None = None
    """The routers' prefix hash key (`prefix_key` wins), so the SharedPrefix blocks warming records are
    the ones they look up. Unset: unkeyed hashes. The chart gives both sides the master agent token."""
    membership_key: SecretStr | None = None
    membership_key_file: Path | None = None
    """The key every fleet membership entry is signed with (`membership_key` wins); the routers'
    `membership_key` must be the same. Unset: entries are unsigned. The chart generates one Secret,
    mounted by the operator and the gateway only."""

    agent_token: SecretStr | None = None
    agent_token_file: Path | None = None
    """The shared token of the snapshot agents (a mounted Secret); `agent_token` wins when both are set."""
    agent_token_secret: str | None = None
    """Name of the Secret (key `token`) that rendered pods mount for their agents. The operator writes
    it into each fleet's namespace, with that namespace's token derived from `agent_token`
    (`llamafleet_core.agent_tokens`): pods never hold the master, nor another namespace's token."""
    pod_api_key_file: Path | None = None
    """llama-server's own API key (a mounted Secret): what fleets with `apiKeySecretRef` run their
    servers with. Warming calls the servers (`/props`, `/tokenize`, `/completion`) with it; unset: the
    servers have none. One key for the installation: a fleet's `apiKeySecretRef` must hold this key."""
    agent_peer_networks: list[str] = Field(default_factory=list)
    """Networks (CIDR) the fleet pods get their addresses from: agents pull snapshots (and present
    their token) only from peers there (`--peer-networks`). Empty: the agent's default, the private
    ranges."""
    gateway_namespace: str | None = None
    """Where the gateway pods run; each fleet's NetworkPolicy admits them from there. Unset: the fleet's
    own namespace (a policy without a namespace selector matches only pods of its own namespace)."""
    operator_namespace: str | None = Field(default=None, validation_alias="POD_NAMESPACE")
    """Where this operator runs (the downward API's POD_NAMESPACE); admitted like the gateway."""
    metrics_peers: list[dict[str, Any]] = Field(default_factory=list)
    """NetworkPolicyPeers (JSON) of your Prometheus: each fleet's NetworkPolicy admits them to the agent
    port (its /metrics). Empty: nobody but the gateway, the operator and the fleet's own pods."""
    metrics_server: bool = False
    """Admit `metrics_peers` to llama-server's port too, for its own /metrics (`--metrics`). That port
    also serves `/slots` and completions, so name only Prometheus there."""
    agent_image: str = Field(default_factory=default_agent_image, min_length=1)
    """The agent image of fleets that name none (`agentImage` unset): this operator's own release by
    default, so upgrading the operator upgrades their agents. The chart sets its own image."""
    model_fleets: ModelFleetList = Field(default_factory=list)
    """Comma-separated `model=namespace/name`: the gateway's `model_fleets` (one chart value,
    `gateway.modelFleets`). A model name two managed fleets serve with no entry here sets
    `ModelConflict` on each of them (the gateway refuses such a name)."""

    reconcile_interval_s: float = Field(default=30.0, gt=0)
    """Level-based re-check of every fleet (status, membership, drift of children)."""
    prefix_interval_s: float = Field(default=10.0, gt=0)
    """How often a SharedPrefix looks for pods that do not hold it yet (new or restarted pods)."""
    http_timeout_s: float = Field(default=120.0, gt=0)
    """Agent calls; a pull of a large snapshot or a first prefill takes a while."""
    allowed_host_paths: list[str] = Field(default_factory=list)
    """Folders a fleet's `model.source.hostPath` may name or lie under; empty: hostPath is refused."""
    allowed_images: list[str] = Field(default_factory=list)
    """Regular expressions (whole match) for `image` and `model.source.image.reference`; empty: any."""
    allowed_agent_images: list[str] = Field(default_factory=list)
    """Regular expressions (whole match) for `agentImage`; empty: any (the chart pins its own image)."""
    allowed_extra_args: list[str] = Field(default_factory=lambda: list(DEFAULT_EXTRA_ARGS))
    """llama-server flags a fleet's `extraArgs` may use (admission.py says what is left out and why)."""
    allow_control_plane: bool = False
    """Let fleets tolerate, select or prefer control-plane nodes."""

    prefix_retry_initial_s: float = Field(default=10.0, gt=0)
    """A SharedPrefix no pod could build is tried again after this, then twice as long each time."""
    prefix_retry_max_s: float = Field(default=600.0, gt=0)
    """The longest wait between two attempts to build a SharedPrefix that keeps failing."""

    @field_validator("agent_peer_networks")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        return check_networks(value)

    @field_validator("metrics_peers")
    @classmethod
    def _check_metrics_peers(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for peer in value:
            keys = set(peer)
            if not keys or keys - PEER_KEYS or ("ipBlock" in keys and len(keys) > 1):
                raise ValueError(f"metrics_peers: {peer} is not a NetworkPolicyPeer (podSelector and/or "
                                 "namespaceSelector, or ipBlock alone)")
        return value

    def model_owners(self) -> dict[str, str]:
        """`model_fleets` as {model: `namespace/name`}."""
        return parse_model_fleets(self.model_fleets)

    def resolved_pod_api_key(self) -> str | None:
        if self.pod_api_key_file is None:
            return None
        return self.pod_api_key_file.read_text().strip() or None

    def admission_policy(self) -> AdmissionPolicy:
        """What fleets may ask for (raises ValueError at start-up for a pattern that does not compile)."""
        return AdmissionPolicy(
            host_paths=tuple(self.allowed_host_paths), images=tuple(self.allowed_images),
            agent_images=tuple(self.allowed_agent_images), extra_args=frozenset(self.allowed_extra_args),
            control_plane=self.allow_control_plane, agent_token_secret=self.agent_token_secret,
        )

    def resolved_membership_key(self) -> bytes:
        """The membership signing key from the configured secret; b"": entries are unsigned."""
        return membership_key(secret_text(self.membership_key, self.membership_key_file))

    def resolved_prefix_key(self) -> bytes:
        """The prefix hash key as `prefix_key_bytes` makes it from the configured secret; b"": unkeyed."""
        return prefix_key_bytes(secret_text(self.prefix_key, self.prefix_key_file))

    def resolved_agent_token(self) -> str:
        if self.agent_token is not None and self.agent_token.get_secret_value():
            return self.agent_token.get_secret_value()
        if self.agent_token_file is not None:
            return self.agent_token_file.read_text().strip()
        return ""

"""Operator settings (environment prefix `LLAMAFLEET_OPERATOR_`), read once at start-up.

They reach handlers through kopf's `memo` (no module-level state): `cli.main` builds them, `startup`
turns them into clients.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from llamafleet_core.settings_support import RedisUrl


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

    agent_token: SecretStr | None = None
    agent_token_file: Path | None = None
    """The shared token of the snapshot agents (a mounted Secret); `agent_token` wins when both are set."""
    agent_token_secret: str | None = None
    """Name of the Secret (key `token`) that rendered pods mount for their agents."""
    gateway_namespace: str | None = None
    """Where the gateway pods run; each fleet's NetworkPolicy admits them from there. Unset: the fleet's
    own namespace (a policy without a namespace selector matches only pods of its own namespace)."""
    operator_namespace: str | None = Field(default=None, validation_alias="POD_NAMESPACE")
    """Where this operator runs (the downward API's POD_NAMESPACE); admitted like the gateway."""

    reconcile_interval_s: float = Field(default=30.0, gt=0)
    """Level-based re-check of every fleet (status, membership, drift of children)."""
    prefix_interval_s: float = Field(default=10.0, gt=0)
    """How often a SharedPrefix looks for pods that do not hold it yet (new or restarted pods)."""
    http_timeout_s: float = Field(default=120.0, gt=0)
    """Agent calls; a pull of a large snapshot or a first prefill takes a while."""

    def resolved_agent_token(self) -> str:
        if self.agent_token is not None and self.agent_token.get_secret_value():
            return self.agent_token.get_secret_value()
        if self.agent_token_file is not None:
            return self.agent_token_file.read_text().strip()
        return ""

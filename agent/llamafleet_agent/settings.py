"""Agent settings (environment prefix `LLAMAFLEET_AGENT_`).

The KV settings are given, not discovered: llama-server does not report its cache types, flash-attention
or unified-KV choice anywhere, and the agent is started from the same rendered pod spec as the server, so
the spec is the one source of truth for both. Only the build string is read from the server (`/props`).
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from llamafleet_core.networks import PRIVATE_NETWORKS
from llamafleet_core.settings_support import NetworkList
from llamafleet_core.snapshot_signing import manifest_key

MIB = 1024 * 1024


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLAMAFLEET_AGENT_", extra="ignore")

    llama_url: str = "http://127.0.0.1:8080"
    snapshot_dir: Path = Path("snapshots")  # the server's --slot-save-path
    model_file: Path = Path("model.gguf")  # hashed once for the fingerprint
    model_sha256: str | None = None  # skip hashing when the deployer already knows the digest
    model_name: str = ""
    fleet: str = ""  # the LlamaFleet this pod belongs to (logs, metrics)
    attach: bool = False  # llama-server runs a patched build with --slot-attach (reported, not used yet)
    # `llama-server --help` as the pod's detector init container wrote it; reported as `features`.
    server_help_file: Path | None = None

    # The server's launch settings, from the same pod spec (see the module docstring).
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "on"
    kv_unified: bool = False
    slots: int = Field(default=4, ge=1)
    swa_full: bool = False
    attn_rot_disabled: bool = False

    token: SecretStr | None = None
    token_file: Path | None = None
    # The key that signs and verifies snapshot manifests (`llamafleet_core.snapshot_signing`). Unset:
    # derived from the token, which only the agent container mounts. Agents that pull from each other
    # need the same key; llama-server's container must never be able to read it.
    signing_key: SecretStr | None = None
    signing_key_file: Path | None = None
    # llama-server's own API key (`--api-key-file` of the server beside it): sent on every call to it.
    llama_api_key: SecretStr | None = None
    llama_api_key_file: Path | None = None
    # A pull's `source` must be `http(s)://<IP literal in one of these>:<port>`: the agent presents its
    # token there, so it never goes to a metadata service, a host name or a URL with a path.
    peer_networks: NetworkList = Field(default_factory=lambda: list(PRIVATE_NETWORKS))
    # `/metrics` answers without the token (Prometheus holds none): it recounts the folder at most this
    # often, so that unauthenticated scrapes cannot make it read every manifest on every request.
    metrics_refresh_s: float = Field(default=5.0, ge=0)
    budget_bytes: int = Field(default=8 * 1024 * MIB, ge=0)
    max_body_bytes: int = Field(default=MIB, ge=1024)
    pod_name: str = Field(default_factory=socket.gethostname)
    # Unready until the warmer declared the required snapshots (`PUT /v1/required`), see required.py.
    await_required: bool = False

    host: str = "127.0.0.1"
    port: int = 8081

    def resolved_signing_key(self, token: str) -> bytes:
        """The manifest key: from `signing_key`, else `signing_key_file`, else derived from `token`."""
        return manifest_key(_secret(self.signing_key, self.signing_key_file) or token)

    def resolved_llama_api_key(self) -> str | None:
        """llama-server's API key from `llama_api_key`, else `llama_api_key_file`; None: it has none."""
        return _secret(self.llama_api_key, self.llama_api_key_file)

    def resolved_token(self) -> str:
        """The shared token, from `token` or else `token_file`; the agent never runs without one."""
        if self.token is not None and self.token.get_secret_value():
            return self.token.get_secret_value()
        if self.token_file is not None:
            value = self.token_file.read_text().strip()
            if value:
                return value
        raise ValueError("the agent needs a shared token: set LLAMAFLEET_AGENT_TOKEN or a token file")


def _secret(value: SecretStr | None, path: Path | None) -> str | None:
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    if path is not None:
        text = path.read_text().strip()
        return text or None
    return None

"""The `SharedPrefix` custom resource: a prompt prefix (tools plus system messages) kept warm on a fleet.

The operator renders it with the model's chat template, prefills it once, snapshots it and ships the
snapshot to every pod of the fleet (DESIGN.md section 4, "Warm a SharedPrefix").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from llamafleet_core.crd import rules
from llamafleet_core.crd.base import Condition, CRModel, Name, Resource, StatusModel


class FleetRef(CRModel):
    name: Name
    """A LlamaFleet in the same namespace."""


class Message(CRModel):
    role: Literal["system", "developer"] = "system"
    content: str
    """Only system-side messages: the prefix ends where the first user message would start."""


class ConfigMapKeyRef(CRModel):
    name: Name
    """A ConfigMap in the SharedPrefix's namespace."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key of its `data` that holds the text."""


class TextSource(CRModel):
    """Where the raw text lives when it is too large to inline: a ConfigMap's data is no annotation, so
    client-side `kubectl apply` copies only this reference into `last-applied-configuration`."""

    config_map_key_ref: ConfigMapKeyRef


class SharedPrefixSpec(CRModel):
    """Tools plus system messages (rendered with the model's template), or raw text used as is."""

    model_config = CRModel.model_config | {
        "json_schema_extra": rules.validations(rules.PREFIX_SPEC_RULES)}

    fleet_ref: FleetRef
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """OpenAI tool definitions, exactly as clients send them (free-form JSON)."""
    messages: list[Message] = Field(default_factory=list)
    text: str | None = Field(default=None, min_length=1)
    """A raw prompt prefix, tokenized as is; exclusive with messages and tools."""
    text_from: TextSource | None = None
    """The raw text read from a ConfigMap instead (re-read on every reconcile); exclusive with text."""
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra chat-template variables (e.g. enable_thinking), as clients pass chat_template_kwargs."""
    pin: bool = True
    """Keep the snapshot under every pod's byte budget (never evicted) while this resource exists."""

    @model_validator(mode="after")
    def _messages_xor_text(self) -> SharedPrefixSpec:
        raw = self.text is not None or self.text_from is not None
        if self.text is not None and self.text_from is not None:
            raise ValueError(rules.TEXT_OR_TEXT_FROM)
        if raw and (self.messages or self.tools):
            raise ValueError(rules.TEXT_EXCLUSIVE)
        if not raw and not self.messages and not self.tools:
            raise ValueError(rules.PREFIX_EMPTY)
        return self


class PodPrefixState(CRModel):
    """Where one pod stands with this prefix."""

    name: str
    state: Literal["Pending", "Warming", "Pulling", "Warm", "Failed"]
    tokens: int | None = None
    bytes: int | None = None
    message: str = ""


class SharedPrefixStatus(StatusModel):
    tokens: int | None = None
    hash: str | None = None
    """Hash of the prefix's token ids: what identifies the snapshot."""
    bytes: int | None = None
    warm_pods: int | None = None
    desired_pods: int | None = None
    warm: str | None = None
    """`warmPods/desiredPods` as text, for the WARM printer column."""
    pods: list[PodPrefixState] = Field(default_factory=list)
    last_warm_time: datetime | None = None
    phase: Literal["Pending", "Warming", "Warm", "Degraded", "Failed"] | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class SharedPrefix(Resource):
    kind: Literal["SharedPrefix"] = "SharedPrefix"
    spec: SharedPrefixSpec
    status: SharedPrefixStatus | None = None

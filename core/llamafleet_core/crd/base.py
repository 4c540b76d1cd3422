"""Shared building blocks of the custom resource models.

Every model is camelCase on the wire (Kubernetes convention) and snake_case in Python, and forbids unknown
fields: the API server prunes unknown fields anyway (structural schemas), so an unknown field can only come
from a typo in a manifest, and we would rather say so than silently ignore it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from llamafleet_core.labels import API_VERSION

# Kubernetes resource.Quantity, e.g. 8Gi, 500M, 1.5e9 or a plain integer of bytes.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i?|m|k)?$"
_SUFFIX = {
    "": 1, "m": 0.001, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}

# A DNS-1123 subdomain: what Kubernetes accepts as most object names.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]

# int-or-string in the CRD (x-kubernetes-int-or-string); the generator recognises this exact union.
Quantity = Annotated[int | Annotated[str, Field(pattern=QUANTITY_PATTERN)], Field()]


def quantity_bytes(value: int | str) -> int:
    """Bytes in a Kubernetes quantity (`8Gi` -> 8589934592). Raises ValueError on a malformed one."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"([+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)([KMGTPE]i?|m|k)?", value.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    return int(float(number) * _SUFFIX[suffix])


class CRModel(BaseModel):
    """Base of every spec and status model: camelCase aliases, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase, without fields left unset (so server-side defaults still apply)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(CRModel):
    """Base of status models: unknown keys are ignored, not rejected.

    Only the operator writes status, but kopf may keep its own progress under `status.kopf` (and handler
    results under `status.<handler id>`) where the API server does not prune them (e.g. in tests).
    """

    model_config = ConfigDict(extra="ignore")


class Condition(CRModel):
    """One entry of `status.conditions`, the shape of metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class ObjectMeta(CRModel):
    """The few metadata fields the models care about; the rest of metadata passes through untouched."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Resource(CRModel):
    """Fields common to both kinds: apiVersion, kind and metadata."""

    api_version: Literal["llamafleet.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

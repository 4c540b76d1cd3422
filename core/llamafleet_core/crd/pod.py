"""What a LlamaFleet adds to its pods beside what the operator renders: pull secrets, runtime and priority
classes, environment (of llama-server), labels and annotations.

The operator's own labels select the fleet's pods (workload selector, Service, PDB, NetworkPolicy, the
gateway's discovery, the PodMonitors) and its annotations drive rollouts and routing, so a fleet may not
set those keys: a spec that tries is refused (CEL in the CRD at `kubectl apply`, and the model here for
the operator's status), never silently overridden either way. Likewise the environment variables the
operator sets (the pod's identity, which the snapshot folder's sub-path is named after).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from llamafleet_core import labels as L
from llamafleet_core.crd.base import CRModel, Name

RESERVED_PREFIX = f"{L.GROUP}/"
#: The `app.kubernetes.io/*` labels the operator sets on every pod (`labels.common_labels`).
RESERVED_LABELS: tuple[str, ...] = (
    L.APP_NAME, L.APP_INSTANCE, L.APP_COMPONENT, L.APP_PART_OF, L.APP_MANAGED_BY)
#: Environment variables the operator sets in both containers (render/pod.py `_env_pod_identity`).
RESERVED_ENV: tuple[str, ...] = ("POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP")
MAX_ENTRIES = 64  # bounds the CEL rules' cost, as the API server estimates it


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _bounded(entries: dict[str, str]) -> dict[str, str]:
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} entries")
    return entries


def _no_reserved_labels(labels: dict[str, str]) -> dict[str, str]:
    taken = sorted(k for k in labels if k.startswith(RESERVED_PREFIX) or k in RESERVED_LABELS)
    if taken:
        raise ValueError(f"the operator sets and selects on {', '.join(taken)}: choose other label keys")
    return labels


def _no_reserved_annotations(annotations: dict[str, str]) -> dict[str, str]:
    taken = sorted(k for k in annotations if k.startswith(RESERVED_PREFIX))
    if taken:
        raise ValueError(f"the operator sets {', '.join(taken)} ({RESERVED_PREFIX}* is its own): "
                         "choose other annotation keys")
    return annotations


PodLabels = Annotated[
    dict[str, str],
    AfterValidator(_bounded),
    AfterValidator(_no_reserved_labels),
    Field(json_schema_extra={"maxProperties": MAX_ENTRIES, "x-kubernetes-validations": [{
        "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}') && !(k in {_cel_list(RESERVED_LABELS)}))",
        "message": f"{RESERVED_PREFIX}* and the app.kubernetes.io/* labels the operator sets are reserved "
                   "(the fleet's selectors use them)",
    }]}),
]
PodAnnotations = Annotated[
    dict[str, str],
    AfterValidator(_bounded),
    AfterValidator(_no_reserved_annotations),
    Field(json_schema_extra={"maxProperties": MAX_ENTRIES, "x-kubernetes-validations": [{
        "rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
        "message": f"{RESERVED_PREFIX}* annotations are the operator's own",
    }]}),
]


class EnvVar(CRModel):
    """A container environment variable, as in a pod spec (`value`, or `valueFrom` a Secret, a ConfigMap
    or a field)."""

    model_config = CRModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [
            {"rule": "!(has(self.value) && has(self.valueFrom))",
             "message": "set value or valueFrom, not both"},
            {"rule": f"!(self.name in {_cel_list(RESERVED_ENV)})",
             "message": "the operator sets POD_NAME, POD_NAMESPACE, POD_UID and POD_IP itself"},
        ]}
    }

    name: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: dict[str, Any] | None = None
    """An EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef), passed through."""

    @model_validator(mode="after")
    def _checked(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        if self.name in RESERVED_ENV:
            raise ValueError(f"env {self.name}: the operator sets {', '.join(RESERVED_ENV)} itself")
        return self

    def secret_name(self) -> str | None:
        """The Secret a `valueFrom.secretKeyRef` reads, if any."""
        ref = (self.value_from or {}).get("secretKeyRef") or {}
        name = ref.get("name") if isinstance(ref, dict) else None
        return name if isinstance(name, str) else None


EnvList = Annotated[list[EnvVar], Field(max_length=MAX_ENTRIES)]


class LocalObjectReference(CRModel):
    name: Name


class PodTemplate(CRModel):
    """Pod-level settings passed through to the fleet's pod template (each optional)."""

    labels: PodLabels = Field(default_factory=dict)
    """Added to the pods' labels; never the operator's own keys (llamafleet.io/*, its app.kubernetes.io/*)."""
    annotations: PodAnnotations = Field(default_factory=dict)
    """Added to the pods' annotations (e.g. a service mesh's or a log shipper's); never llamafleet.io/*."""
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, max_length=MAX_ENTRIES)
    """Secrets (in the fleet's namespace) to pull `image`, `agentImage` and a model image with."""
    runtime_class_name: Name | None = None
    """A RuntimeClass, e.g. `nvidia` where the NVIDIA runtime is not the node's default."""
    priority_class_name: Name | None = None
    """A PriorityClass: fleet pods hold warm KV caches that take minutes to rebuild."""
    env: EnvList = Field(default_factory=list)
    """Extra environment of the llama-server container (e.g. `CUDA_VISIBLE_DEVICES`, `GGML_*`). Not
    `LLAMA_*` (llama-server reads its flags from `LLAMA_ARG_*`: use extraArgs, whose allow-list applies)
    nor `LD_*`: the operator's admission policy refuses them. The agent gets none: it holds the agent
    token, and its settings are the operator's."""

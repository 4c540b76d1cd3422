"""The `LlamaFleet` custom resource: a set of identical llama-server pods serving one model.

Every field that changes the KV cache layout (cache types, flash attention, unified KV, slot count) is
pinned, never left to `auto`: a snapshot restores only into a pod whose layout matches exactly, so pods of
one fleet must never resolve these differently (DESIGN.md section 5).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from llamafleet_core.crd import rules
from llamafleet_core.crd.base import Condition, CRModel, Name, Quantity, Resource, StatusModel
from llamafleet_core.crd.pod import PodTemplate

# llama.cpp's accepted KV cache types (`kv_cache_types` in common/arg.cpp), by ggml type name.
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
UNQUANTIZED: frozenset[str] = frozenset({"f32", "f16", "bf16"})

WorkloadKind = Literal["Deployment", "StatefulSet"]


class ImageSource(CRModel):
    """A model baked into a container image; an init container copies `path/file` out of it."""

    reference: str = Field(min_length=1)
    path: str = Field(default="/models", pattern=r"^/")
    """Directory inside the image that holds the model file."""


class ModelSource(CRModel):
    """Where the GGUF file comes from. Exactly one of url, pvc, hostPath, image."""

    model_config = CRModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [{
                "rule": "[has(self.url), has(self.pvc), has(self.hostPath), has(self.image)]"
                        ".filter(x, x).size() == 1",
                "message": "set exactly one of url, pvc, hostPath, image",
            }]
        }
    }

    url: str | None = Field(default=None, pattern=r"^https?://")
    """Downloaded by an init container into an emptyDir on every pod start."""
    pvc: Name | None = None
    """A PersistentVolumeClaim (ReadOnlyMany or ReadWriteMany) holding the file, mounted read-only."""
    host_path: str | None = Field(default=None, pattern=r"^/")
    """A directory on every node holding the file, mounted read-only."""
    image: ImageSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        chosen = [n for n in ("url", "pvc", "host_path", "image") if getattr(self, n) is not None]
        if len(chosen) != 1:
            raise ValueError(
                f"model.source: set exactly one of url, pvc, hostPath, image (got {chosen or 'none'})")
        return self


class ModelSpec(CRModel):
    """The model: the name clients send, the file, and where it comes from."""

    name: str = Field(min_length=1, max_length=253)
    """The model name clients use in requests; also the /v1/models id (llama-server `-a`)."""
    file: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*$")
    """File name of the GGUF inside the source (may include sub-folders, never `..`)."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Digest of the file. Snapshot fingerprints use it; url downloads are verified against it."""
    source: ModelSource


class GpuSpec(CRModel):
    """GPUs per pod and where such GPUs are."""

    count: int = Field(default=1, ge=0, le=16)
    product: str = ""
    """Value of the `nvidia.com/gpu.product` node label to schedule on; empty to schedule on any GPU node.
    (Empty by default: a default naming one product leaves a first install on any other GPU unscheduled.
    Not null: the API server prunes nulls and would apply this default again.)"""
    resource_name: str = "nvidia.com/gpu"


class SecretKeyRef(CRModel):
    name: Name
    key: str = "api-key"


class SnapshotStorage(CRModel):
    """Where the snapshot folder (`--slot-save-path`, shared with the agent) lives.

    memory: tmpfs emptyDir (fast; counts against the pod's memory limit). disk: node-disk emptyDir.
    pvc: a claim per pod with a StatefulSet (volumeClaimTemplates), or an existing shared claim
    (`pvcName`, ReadWriteMany) in which every pod writes under its own pod-name sub-folder.
    """

    storage: Literal["memory", "disk", "pvc"] = "disk"
    size_limit: Quantity = "8Gi"
    pvc_name: Name | None = None
    storage_class: str | None = None
    budget_bytes: int | None = Field(default=None, ge=0)
    """Byte budget the agent keeps snapshots under (LRU out first); default 90% of sizeLimit."""


FeatureMode = Literal["auto", "on", "off"]


class PrefixSharing(CRModel):
    """Flags of patched llama-server builds (the prefix-sharing proposal), each `auto`, `on` or `off`.

    `auto` turns a flag on once the image is known to accept it: the operator runs `serverBinary --help`
    in an init container from `image` and the agent reports what the text names (status.imageFeatures).
    Until then, and for images without a POSIX shell (the detector's), `auto` stays off. `on` renders
    the flag regardless (an image without it fails at start, loudly); `off` never does.
    """

    attach: FeatureMode = "auto"
    """`--slot-attach`: slots share one copy of a prefix's KV. Needs kvUnified (one pool to share)."""
    cache_prefix: FeatureMode = "auto"
    """`--cache-prefix`: a persistent RAM cache entry at the first user message. Needs the RAM cache
    (cacheRamMiB not 0)."""
    snapshot_checkpoints: FeatureMode = "auto"
    """`--slot-save-checkpoints`: a snapshot file carries the slot's last context checkpoints, so a
    restored slot of a sliding-window model resumes from it (upstream recomputes its whole prompt, and
    the agents then turn restores off: status.restores) and one of a hybrid model also before its end.
    `auto` uses the detection `attach` or `cachePrefix` in `auto` start (alone it starts none)."""
    head_tokens: int | None = Field(default=None, ge=1, le=1 << 21)
    """Tokens of the head the fleet's sessions share (tool schemas and system prompt). Where slots
    attach, the unified pool then holds it once plus every slot's own context,
    `headTokens + slots * (contextPerSlot - headTokens)`, instead of `slots * contextPerSlot`; sessions
    of other heads beyond that find the pool full. Unset: the pool is not shrunk."""
    server_binary: str = Field(default="/app/llama-server", pattern=r"^/[A-Za-z0-9._/+-]+$", max_length=255)
    """Where llama-server is inside `image`, for detection (the official llama.cpp server images'
    path by default; when absent there, the detector looks `llama-server` up on the PATH)."""


class LlamaFleetSpec(CRModel):
    """Desired state of a fleet of llama-server pods."""

    # The cross-field rules of `_consistent`, also in CEL, so that the API server rejects a bad spec.
    model_config = CRModel.model_config | {
        "json_schema_extra": rules.validations(rules.FLEET_SPEC_RULES)}

    model: ModelSpec
    image: str = Field(min_length=1)
    """The llama-server image; its entrypoint must be llama-server."""
    agent_image: str | None = Field(default=None, min_length=1)
    """The image with the `llamafleet` command (the snapshot agent sidecar). Unset: the operator's own
    release, chosen when it renders (no stored default), so upgrading the operator upgrades the agents."""
    replicas: int = Field(default=1, ge=1, le=256)
    slots: int = Field(default=4, ge=1, le=64)
    """llama-server slots per pod (`-np`)."""
    context_per_slot: int = Field(default=32768, ge=512, le=1 << 21)
    """Tokens each slot may hold."""
    context_total: int | None = Field(default=None, ge=512)
    """With a unified pool: its size in tokens. Default slots * contextPerSlot, or, where slots attach and
    `prefixSharing.headTokens` is set, the head once plus every slot's own context (podspec.for_image)."""
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    flash_attention: Literal["on", "off"] = "on"
    """Pinned on or off, never auto: the choice changes the KV layout that snapshots hold."""
    kv_unified: bool | None = None
    """One KV pool shared by all slots. Unset: one pool exactly where slots attach (an image with
    --slot-attach, `prefixSharing.attach` not off), per-slot streams elsewhere, which keep idle
    prefixes in VRAM on upstream builds."""
    cache_ram_mib: int | None = Field(default=None, ge=-1, alias="cacheRamMiB")
    """llama-server's RAM prompt cache in MiB (`--cache-ram`; -1 unlimited, 0 off; unset: server default)."""
    ctx_checkpoints: int | None = Field(default=None, ge=0, le=4096)
    threads: int | None = Field(default=None, ge=1, le=1024)
    extra_args: list[str] = Field(default_factory=list)
    """Appended verbatim after every flag the operator sets."""
    api_key_secret_ref: SecretKeyRef | None = None
    gpu: GpuSpec | None = None
    """Absent: CPU-only pods."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None
    """Container resources of llama-server (requests/limits); GPU limits are added from `gpu`."""
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    """Pull secrets, runtime and priority class, llama-server's extra env, labels and annotations."""
    snapshots: SnapshotStorage = Field(default_factory=SnapshotStorage)
    prefix_sharing: PrefixSharing = Field(default_factory=PrefixSharing)
    workload: WorkloadKind = "Deployment"
    """Deployment by default. Snapshots are a cache that peers and SharedPrefix warming rebuild, and index
    entries are fenced by pod uid, so a stable pod identity buys routing nothing, while Deployments roll
    faster (surge) and need no PVC. Choose StatefulSet with `snapshots.storage: pvc` to give each pod its own
    claim (volumeClaimTemplates) that survives restarts, so a restarted pod finds its snapshots again."""

    @model_validator(mode="after")
    def _consistent(self) -> LlamaFleetSpec:
        if self.cache_type_v not in UNQUANTIZED and self.flash_attention == "off":
            raise ValueError(f"{rules.QUANTIZED_V_NEEDS_FA} (got {self.cache_type_v})")
        if self.prefix_sharing.attach == "on" and self.kv_unified is False:
            raise ValueError(rules.ATTACH_NEEDS_UNIFIED)
        if self.prefix_sharing.cache_prefix == "on" and self.cache_ram_mib == 0:
            raise ValueError(rules.CACHE_PREFIX_NEEDS_RAM)
        if self.context_total is not None and self.kv_unified is False:
            raise ValueError(rules.CONTEXT_TOTAL_NEEDS_UNIFIED)
        head = self.prefix_sharing.head_tokens
        if head is not None and head >= self.context_per_slot:
            raise ValueError(rules.HEAD_BELOW_SLOT_CONTEXT)
        snaps = self.snapshots
        if snaps.storage == "pvc" and self.workload == "Deployment" and snaps.pvc_name is None:
            raise ValueError(rules.PVC_NEEDS_NAME)
        return self

    @property
    def n_ctx(self) -> int:
        """`-c`: per-slot streams split it evenly, so slots * contextPerSlot unless a unified pool is set."""
        if self.kv_unified and self.context_total is not None:
            return self.context_total
        return self.slots * self.context_per_slot


class ImageFeatures(StatusModel):
    """What `image`'s llama-server accepts, as one of its pods' agents reported it.

    Kept per image: a spec with another image drops the record, and `auto` flags stay off until a pod of
    the new image reports again (a new pod template, so one more rollout once it has)."""

    image: str
    known: bool
    """False when the pod's help text was not llama-server's (no shell, a library missing, wrong path)."""
    slot_attach: bool = False
    cache_prefix: bool = False
    slot_checkpoints: bool = False
    model: str = ""
    """The model the reporting pod served (`spec.model`'s file and a digest of the whole of it); empty
    in a record from before the operator kept it."""
    sliding_window: int | None = None
    """That model's sliding window in tokens, from its metadata. llama-server attaches no slot of such a
    model, so `attach: auto` stays off for it and its pods keep per-slot KV streams."""
    pod: str = ""
    """The pod whose agent reported it."""
    detected_at: str = ""
    message: str = ""


class LlamaFleetStatus(StatusModel):
    replicas: int | None = None
    ready_replicas: int | None = None
    ready: str | None = None
    """`readyReplicas/replicas` as text, for the READY printer column."""
    slots: int | None = None
    """Slots of ready pods (readyReplicas * spec.slots)."""
    selector: str | None = None
    """Label selector of the fleet's pods, for the scale subresource (kubectl scale, autoscalers)."""
    attach: bool | None = None
    """Whether llama-server runs with --slot-attach."""
    cache_prefix: bool | None = None
    """Whether llama-server runs with --cache-prefix."""
    slot_context: int | None = None
    """Tokens each slot really holds, as the pods' llama-server reports it (the smallest): below
    contextPerSlot when the model's training context capped it (condition ContextCapped)."""
    restores: Literal["reusable", "unusable"] | None = None
    """Whether the pods' llama-server resumes from a slot restored from a snapshot file, as their agents
    probed it at start: `unusable` (a sliding-window model on upstream llama-server) turns the gateway's
    restores off for the fleet, and condition RestoresOff says why."""
    image_features: ImageFeatures | None = None
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"] | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class LlamaFleet(Resource):
    kind: Literal["LlamaFleet"] = "LlamaFleet"
    spec: LlamaFleetSpec
    status: LlamaFleetStatus | None = None

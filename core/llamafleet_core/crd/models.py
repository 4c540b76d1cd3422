"""The custom resource models, in one import: `from llamafleet_core.crd.models import LlamaFleet`.

Pydantic models are the source of truth; `llamafleet_core.crd.generate` derives the CRD YAML from them.
"""

from llamafleet_core.crd.base import Condition, CRModel, ObjectMeta, Quantity, quantity_bytes
from llamafleet_core.crd.fleet import (
    CacheType,
    GpuSpec,
    ImageFeatures,
    ImageSource,
    LlamaFleet,
    LlamaFleetSpec,
    LlamaFleetStatus,
    ModelSource,
    ModelSpec,
    PrefixSharing,
    SecretKeyRef,
    SnapshotStorage,
    WorkloadKind,
)
from llamafleet_core.crd.prefix import (
    FleetRef,
    Message,
    PodPrefixState,
    SharedPrefix,
    SharedPrefixSpec,
    SharedPrefixStatus,
)

__all__ = [
    "CRModel", "CacheType", "Condition", "FleetRef", "GpuSpec", "ImageFeatures", "ImageSource", "LlamaFleet",
    "LlamaFleetSpec",
    "LlamaFleetStatus", "Message", "ModelSource", "ModelSpec", "ObjectMeta", "PodPrefixState",
    "PrefixSharing",
    "Quantity", "SecretKeyRef", "SharedPrefix", "SharedPrefixSpec", "SharedPrefixStatus", "SnapshotStorage",
    "WorkloadKind", "quantity_bytes",
]

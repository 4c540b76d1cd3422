"""What every renderer needs besides the spec: names, the owner, and a few cluster facts.

Renderers are pure: `Target` carries everything that does not come from the LlamaFleet itself (which
namespace the operator runs in, whether the image supports attach), so the same inputs always render
the same objects and golden files can pin them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet, LlamaFleetSpec
from llamafleet_operator.release import default_agent_image, effective_agent_image

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """Where and for whom the objects are rendered."""

    name: str
    namespace: str
    owner: Manifest | None = None
    """ownerReference of the LlamaFleet: children are garbage-collected with it."""
    attach_supported: bool = False
    """The image is a patched build with --slot-attach (detected: status.imageFeatures)."""
    cache_prefix_supported: bool = False
    """The image is a patched build with --cache-prefix (detected: status.imageFeatures)."""
    checkpoints_supported: bool = False
    """The image is a patched build with --slot-save-checkpoints (detected: status.imageFeatures)."""
    agent_token_secret: str | None = None
    """Secret (key `token`) that router and operator use to call the agent."""
    operator_namespace: str | None = None
    """Namespace of the operator pods; None means the fleet's own namespace."""
    gateway_namespace: str | None = None
    """Namespace of the gateway pods; None means the fleet's own namespace."""
    agent_peer_networks: tuple[str, ...] = ()
    """Networks (CIDR) the agents may pull from (their `--peer-networks`); empty: the agent's default."""
    metrics_peers: tuple[Manifest, ...] = ()
    """NetworkPolicyPeers of Prometheus, admitted to the agent port (and llama-server's: metrics_server)."""
    metrics_server: bool = False
    agent_image: str = field(default_factory=default_agent_image)
    """The agent image of a fleet that names none (the operator's `agent_image` setting)."""

    @classmethod
    def of(cls, fleet: LlamaFleet, *, namespace: str | None = None, **options: Any) -> Target:
        """A target named after the fleet, owned by it when it has a uid (it does once stored)."""
        meta = fleet.metadata
        return cls(
            name=meta.name,
            namespace=namespace or meta.namespace or "default",
            owner=owner_reference(fleet),
            **options,
        )

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"

    def agent_image_of(self, spec: LlamaFleetSpec) -> str:
        """The image of this target's agent containers (and of the model download)."""
        return effective_agent_image(spec.agent_image, self.agent_image)

    def spec_of(self, fleet: LlamaFleet) -> LlamaFleetSpec:
        """The fleet's spec with what depends on this target's image settled (`podspec.for_image`): what
        every renderer of the pods and their config reads."""
        return podspec.for_image(fleet.spec, attach_supported=self.attach_supported)

    def attach(self, spec: LlamaFleetSpec) -> bool:
        """Whether this target's pods run llama-server with --slot-attach."""
        return podspec.attach_enabled(spec, supported=self.attach_supported)

    def cache_prefix(self, spec: LlamaFleetSpec) -> bool:
        """Whether this target's pods run llama-server with --cache-prefix."""
        return podspec.cache_prefix_enabled(spec, supported=self.cache_prefix_supported)

    def snapshot_checkpoints(self, spec: LlamaFleetSpec) -> bool:
        """Whether this target's pods run llama-server with --slot-save-checkpoints."""
        return podspec.snapshot_checkpoints_enabled(spec, supported=self.checkpoints_supported)


def owner_reference(fleet: LlamaFleet) -> Manifest | None:
    if not fleet.metadata.uid:
        return None
    return {
        "apiVersion": L.API_VERSION,
        "kind": "LlamaFleet",
        "name": fleet.metadata.name,
        "uid": fleet.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(target: Target, name: str | None = None, **annotations: str) -> Manifest:
    """Object metadata with the fleet's labels and owner."""
    meta: Manifest = {
        "name": name or target.name,
        "namespace": target.namespace,
        "labels": L.common_labels(target.name),
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if target.owner is not None:
        meta["ownerReferences"] = [dict(target.owner)]
    return meta


def digest(obj: Any) -> str:
    """Stable short digest of JSON-able data (for the pod template's spec-hash annotation)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

"""Label and annotation keys: the contract between the operator, the router and the agent.

The operator writes these onto every object it renders; the router's pod discovery and the NetworkPolicy
select on them. They live in core so that no component has to import another to agree on a string.
"""

from __future__ import annotations

from enum import StrEnum

GROUP = "llamafleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels (selectable). Values must be valid label values (<= 63 chars, alphanumeric edges).
FLEET = f"{GROUP}/fleet"
COMPONENT = f"{GROUP}/component"
MODEL = f"{GROUP}/model"

APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
APP_COMPONENT = "app.kubernetes.io/component"
APP_PART_OF = "app.kubernetes.io/part-of"
APP_MANAGED_BY = "app.kubernetes.io/managed-by"

PART_OF = "llamafleet"
MANAGED_BY = "llamafleet-operator"

# Annotations (not selectable; free-form values).
SPEC_HASH = f"{GROUP}/spec-hash"  # digest of the rendered pod template: rolls pods when it changes
ATTACH = f"{GROUP}/attach"  # "true" when llama-server runs with the patched --slot-attach flag
MODEL_SHA256 = f"{GROUP}/model-sha256"
SLOTS = f"{GROUP}/slots"


class Component(StrEnum):
    """What a labelled pod is; the NetworkPolicy admits traffic by this label."""

    SERVER = "server"
    GATEWAY = "gateway"
    OPERATOR = "operator"


def fleet_labels(fleet: str, component: Component = Component.SERVER) -> dict[str, str]:
    """Selector labels of one fleet's pods: stable for the fleet's life, so never add mutable values here."""
    return {FLEET: fleet, COMPONENT: component.value}


def common_labels(fleet: str, component: Component = Component.SERVER) -> dict[str, str]:
    """Selector labels plus the recommended `app.kubernetes.io/*` set, for every rendered object."""
    return {
        **fleet_labels(fleet, component),
        APP_NAME: "llama-server" if component is Component.SERVER else f"llamafleet-{component.value}",
        APP_INSTANCE: fleet,
        APP_COMPONENT: component.value,
        APP_PART_OF: PART_OF,
        APP_MANAGED_BY: MANAGED_BY,
    }

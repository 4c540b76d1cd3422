"""kopf handlers: decorators only, each delegating to `reconcile/`.

`register(registry, settings)` attaches them to a registry (the CLI's, or a test's own), so the timer
intervals come from the settings and tests never share kopf's global default registry.
"""

from __future__ import annotations

import kopf

from llamafleet_operator.handlers import fleet, lifecycle, prefix
from llamafleet_operator.settings import OperatorSettings


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> kopf.OperatorRegistry:
    lifecycle.register(registry)
    fleet.register(registry, settings)
    prefix.register(registry, settings)
    return registry


__all__ = ["register"]

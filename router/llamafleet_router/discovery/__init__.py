"""Where the router learns which pods exist, what they serve, and which slots are busy."""

from llamafleet_router.discovery.base import Discovery, PodProps, PodStatus
from llamafleet_router.discovery.static import StaticDiscovery

__all__ = ["Discovery", "PodProps", "PodStatus", "StaticDiscovery"]

"""This operator's release, and the agent image that goes with it.

A fleet that names no `agentImage` runs the agent of the operator that renders it, so upgrading the
operator upgrades those agents too (a new pod template: one rollout). The CRD once defaulted the field
at admission, which froze the agent of every such fleet at the release that admitted it.
"""

from __future__ import annotations

from importlib import metadata

AGENT_REPOSITORY = "llamafleet/llamafleet"
DISTRIBUTION = "llamafleet"
# What the CRD stored in every fleet that named no agent image before the default moved here: such a
# value says "the default", not a choice, so it follows the operator like an absent one.
STORED_DEFAULTS = frozenset({"llamafleet/llamafleet:0.1.0"})


def installed_version() -> str:
    return metadata.version(DISTRIBUTION)


def agent_image_for(version: str) -> str:
    """The agent image of a release: image tags allow no `+` (a PEP 440 local version has one)."""
    return f"{AGENT_REPOSITORY}:{version.replace('+', '-')}"


def default_agent_image() -> str:
    """The agent image of the release installed here (the operator's own)."""
    return agent_image_for(installed_version())


def effective_agent_image(chosen: str | None, default: str) -> str:
    """The image a fleet's agents run: its own `agentImage`, unless absent or a stored old default."""
    return chosen if chosen and chosen not in STORED_DEFAULTS else default

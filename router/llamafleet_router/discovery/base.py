"""The discovery contract: a live list of pods with what the scheduler and the proxy need about each.

Implementations: `StaticDiscovery` (configured URLs, polled). The local runtime and the operator add
their own; they only have to satisfy `Discovery`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol, runtime_checkable

from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.proxy.gone import GoneSignal

#: Called with a pod's ref when it went down, restarted or left, so its index entries are purged
#: (fencing); when it restarted, with the OLD ref, before the pod is routable again.
FenceHook = Callable[[PodRef], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PodProps:
    """What `GET /props` says about a pod, reduced to what routing and prompt rendering use."""

    model: str
    total_slots: int
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""
    build_info: str = ""
    n_ctx: int = 0
    chat_template_caps: Mapping[str, bool] | None = None
    chat_template_tool_use: str = ""
    # The inputs beyond text its model takes (`vision`, `audio`, `video`); None when /props does not say.
    modalities: frozenset[str] | None = None

    @classmethod
    def from_props(cls, props: Mapping[str, Any], model_override: str | None = None) -> PodProps:
        settings = props.get("default_generation_settings") or {}
        caps = props.get("chat_template_caps")
        return cls(
            model=model_override or model_name(props),
            total_slots=int(props.get("total_slots") or 1),
            chat_template=str(props.get("chat_template") or ""),
            bos_token=str(props.get("bos_token") or ""),
            eos_token=str(props.get("eos_token") or ""),
            build_info=str(props.get("build_info") or ""),
            n_ctx=int(settings.get("n_ctx") or 0) if isinstance(settings, Mapping) else 0,
            chat_template_caps=dict(caps) if isinstance(caps, Mapping) else None,
            chat_template_tool_use=str(props.get("chat_template_tool_use") or ""),
            modalities=_modalities(props.get("modalities")),
        )

    def template_props(self) -> dict[str, Any]:
        """The `/props` fields a ChatTemplate is built from (`ChatTemplate.from_props`)."""
        return {
            "chat_template": self.chat_template, "bos_token": self.bos_token, "eos_token": self.eos_token,
            "chat_template_caps": self.chat_template_caps,
            "chat_template_tool_use": self.chat_template_tool_use,
        }


def _modalities(value: Any) -> frozenset[str] | None:
    """`{"vision": true, "audio": false}` as the set of those that are true."""
    if not isinstance(value, Mapping):
        return None
    return frozenset(str(name) for name, on in value.items() if on is True)


def model_name(props: Mapping[str, Any]) -> str:
    """The name clients use for a pod's model: its `--alias`, else its model file's basename.

    llama-server reports the model path as the alias when no alias was given, so an alias equal to the
    path (or containing a slash) counts as "no alias"."""
    path = str(props.get("model_path") or "")
    alias = str(props.get("model_alias") or "")
    if alias and alias != path and "/" not in alias:
        return alias
    return PurePosixPath(path or alias).name or "default"


@dataclass(frozen=True, slots=True)
class PodStatus:
    """One pod as discovery sees it now.

    `endpoint.ready` is False while the pod is down (or was never reached); `props` is None until its
    `/props` was read once. `busy_slots` comes from the latest `/slots` poll (for /health and
    operators; scheduling trusts its own in-flight requests and the slot leases instead). `fleet`:
    the `namespace/name` of the fleet the pod belongs to (membership discovery; None for static pods),
    which decides who serves a model name (`ownership.py`)."""

    endpoint: Endpoint
    props: PodProps | None
    busy_slots: frozenset[int] = frozenset()
    fleet: str | None = None

    @property
    def ready(self) -> bool:
        return self.endpoint.ready and self.props is not None

    @property
    def model(self) -> str | None:
        return self.props.model if self.props else None


@runtime_checkable
class Discovery(Protocol):
    async def start(self) -> None:
        """Start watching; returns once the first view of the fleet is known (pods may still be down)."""

    async def stop(self) -> None: ...

    async def endpoints(self) -> list[PodStatus]:
        """Every known pod, ready or not."""

    def mark_down(self, uid: str) -> None:
        """The proxy could not connect to pod `uid`, or the local runtime saw it die: stop routing to it
        until it answers `/health` again (and have its index entries purged)."""

    def gone(self, uid: str) -> GoneSignal:
        """Set when pod `uid` hangs or goes away: the requests waiting on it stop at once."""

"""The values the warming library takes and returns (pure data, no I/O).

`PrefixSource` is what a SharedPrefix declares, detached from the custom resource so that `llamafleet
up` (which has no Kubernetes object) and the operator warm through the same code. `WarmResult` is what
the operator writes into the SharedPrefix status and what `warm_pod` needs to ship the snapshot to a
pod that starts later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llamafleet_core.crd.prefix import SharedPrefixSpec

PodState = Literal["warm", "failed", "pending"]


class WarmError(RuntimeError):
    """The prefix itself cannot be warmed anywhere (not one pod's trouble): e.g. the template failed.

    The operator turns it into a Degraded condition with this message and `reason` (a CamelCase word);
    pod failures never raise, they are reported per pod in `WarmResult.pods`.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or ("TemplateRenderFailed" if message.startswith("template render failed")
                                 else "WarmFailed")


@dataclass(frozen=True)
class WarmPod:
    """One pod of a fleet: its identity (`uid` fences index entries) and its two endpoints, with
    llama-server's own API key when the pod runs with one (`apiKeySecretRef`; never in the repr)."""

    name: str
    uid: str
    llama_url: str
    agent_url: str
    llama_api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class PrefixSource:
    """Tools plus system messages rendered with the model's template, or raw `text` used as is.

    `model` is the fleet's model name as clients send it: it seeds the block chain and keys the index,
    so it must be the same string the router uses.
    """

    name: str
    model: str
    tools: tuple[dict[str, Any], ...] = ()
    messages: tuple[dict[str, Any], ...] = ()
    text: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_spec(cls, name: str, spec: SharedPrefixSpec, model: str) -> PrefixSource:
        return cls(
            name=name,
            model=model,
            tools=tuple(dict(t) for t in spec.tools),
            messages=tuple({"role": m.role, "content": m.content} for m in spec.messages),
            text=spec.text,
            template_kwargs=MappingProxyType(dict(spec.template_kwargs)),
        )


@dataclass
class PodWarmState:
    """Where one pod stands; `message` says what happened (the agent's own reason on a refusal)."""

    pod: str
    state: PodState
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    message: str = ""


@dataclass
class WarmResult:
    """The snapshot a SharedPrefix became, and every pod's state.

    `snapshot` is empty when no pod could be seeded (then every pod is failed, with its reason).
    `model` is filled by `warm_shared_prefix` so that `remove_shared_prefix` can forget index entries.
    `blocks`: the prefix's block chain under the warming's hash key, which the index records for every
    copy (a manifest saved under an earlier key carries other hashes).
    """

    snapshot: str
    tokens: int
    text_hash: str
    bytes: int
    n_chars: int
    pods: list[PodWarmState]
    model: str = ""
    blocks: tuple[str, ...] = ()

    @property
    def warm(self) -> int:
        return sum(p.state == "warm" for p in self.pods)

    @property
    def desired(self) -> int:
        return len(self.pods)

    def pod(self, name: str) -> PodWarmState | None:
        return next((p for p in self.pods if p.pod == name), None)

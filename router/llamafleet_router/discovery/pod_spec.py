"""One statically configured pod, as the settings (`pods`) and signed membership records name it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One statically configured pod: `url`, `url|agent_url`, or `url|agent_url|attach` for a pod whose
    llama-server runs with the patched `--slot-attach` (an empty agent_url is allowed: `url||attach`)."""

    url: str
    agent_url: str | None = None
    attach: bool = False
    fleet: str | None = None  # `namespace/name` with membership discovery; static pods have none

    @classmethod
    def parse(cls, text: str) -> PodSpec:
        url, _, rest = text.strip().partition("|")
        agent, _, flag = rest.partition("|")
        url, agent, flag = url.strip().rstrip("/"), agent.strip().rstrip("/"), flag.strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"pod URL must start with http:// or https://: {url!r}")
        if agent and not agent.startswith(("http://", "https://")):
            raise ValueError(f"agent URL must start with http:// or https://: {agent!r}")
        if flag not in ("", "attach"):
            raise ValueError(f"the third field of a pod may only be `attach`: {flag!r}")
        return cls(url, agent or None, flag == "attach")

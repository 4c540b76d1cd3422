"""One statically configured pod, as the settings (`pods`) and signed membership records name it."""

from __future__ import annotations

from dataclasses import dataclass

# The third field's flags: what a patched llama-server pod runs with.
FLAGS = ("attach", "cache-prefix")


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One statically configured pod: `url`, `url|agent_url`, or `url|agent_url|flags` where `flags` is a
    `+`-separated list of `attach` (the patched `--slot-attach`) and `cache-prefix` (`--cache-prefix`);
    an empty agent_url is allowed: `url||attach+cache-prefix` (not commas: they separate pods)."""

    url: str
    agent_url: str | None = None
    attach: bool = False
    fleet: str | None = None  # `namespace/name` with membership discovery; static pods have none
    cache_prefix: bool = False

    @classmethod
    def parse(cls, text: str) -> PodSpec:
        url, _, rest = text.strip().partition("|")
        agent, _, field = rest.partition("|")
        url, agent = url.strip().rstrip("/"), agent.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"pod URL must start with http:// or https://: {url!r}")
        if agent and not agent.startswith(("http://", "https://")):
            raise ValueError(f"agent URL must start with http:// or https://: {agent!r}")
        flags = {flag.strip() for flag in field.split("+") if flag.strip()}
        if unknown := sorted(flags - set(FLAGS)):
            raise ValueError(f"the third field of a pod may only list {', '.join(FLAGS)}: {unknown[0]!r}")
        return cls(url, agent or None, "attach" in flags, cache_prefix="cache-prefix" in flags)

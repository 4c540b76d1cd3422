"""What `llamafleet up` shows while it starts and runs: pods up, prefixes warm, and why not.

The state is plain data updated by the runtime; `summary()` is a pure function of it, and the same
dictionary is what the gateway's `/health` body carries under `fleet`. Lines go to stderr only when
they change, so a log of a long run stays short.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from llamafleet_core.warming import PodWarmState


@dataclass
class PrefixProgress:
    """One SharedPrefix: per-pod states as the warming library reports them."""

    name: str
    pods: dict[str, PodWarmState] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    error: str = ""

    @property
    def warm(self) -> int:
        return sum(s.state == "warm" for s in self.pods.values())

    @property
    def tokens(self) -> int:
        return max((s.tokens for s in self.pods.values()), default=0)

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.monotonic()) - self.started


@dataclass
class FleetProgress:
    pods_total: int
    pods_up: set[str] = field(default_factory=set)
    prefixes: dict[str, PrefixProgress] = field(default_factory=dict)
    restarts: int = 0
    # Per pod: the context each of its slots holds, as its llama-server reports it (None: it did not say).
    slot_contexts: dict[str, int | None] = field(default_factory=dict)
    # Per pod: whether its server resumes restored slots (`restores.py`): reusable, unusable or pending.
    restores: dict[str, str] = field(default_factory=dict)

    def prefix_warm(self, p: PrefixProgress) -> bool:
        return not p.error and p.finished is not None and p.warm == self.pods_total

    @property
    def ready(self) -> bool:
        return len(self.pods_up) == self.pods_total and all(map(self.prefix_warm, self.prefixes.values()))

    def summary(self) -> dict[str, Any]:
        """The JSON-able state (also `/health`'s `fleet` field)."""
        return {
            "ready": self.ready,
            "pods_up": len(self.pods_up),
            "pods": self.pods_total,
            "prefixes_warm": sum(map(self.prefix_warm, self.prefixes.values())),
            "prefixes": len(self.prefixes),
            "restarts": self.restarts,
            "slot_context": dict(sorted(self.slot_contexts.items())),
            "restores": dict(sorted(self.restores.items())),
            "shared_prefixes": {
                p.name: {"warm": p.warm, "desired": self.pods_total, "tokens": p.tokens,
                         "seconds": round(p.seconds, 2), "error": p.error or None,
                         "failed": {s.pod: s.message for s in p.pods.values() if s.state == "failed"}}
                for p in self.prefixes.values()
            },
        }


def line(state: FleetProgress) -> str:
    """One status line, e.g. `pods up 2/2 | prefixes warm 1/1 | coding-agent 2/2 pods, 3412 tokens, 1.4s`."""
    s = state.summary()
    parts = [f"pods up {s['pods_up']}/{s['pods']}", f"prefixes warm {s['prefixes_warm']}/{s['prefixes']}"]
    for name, p in s["shared_prefixes"].items():
        detail = f"{name} {p['warm']}/{p['desired']} pods"
        if p["tokens"]:
            detail += f", {p['tokens']} tokens"
        detail += f", {p['seconds']:.1f}s"
        if p["error"]:
            detail += f" ERROR: {p['error']}"
        parts.append(detail)
    return " | ".join(parts)


class Reporter:
    """Prints `line()` to `stream` whenever it changes (seconds excluded, or it would always change)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._last = ""

    def __call__(self, state: FleetProgress) -> None:
        text = line(state)
        key = _without_seconds(text)
        if key != self._last:
            self._last = key
            self.say(text)

    def say(self, text: str) -> None:
        print(f"llamafleet up: {text}", file=self.stream, flush=True)


def _without_seconds(text: str) -> str:
    return " ".join(w for w in text.split() if not (w.endswith("s") and w[:-1].replace(".", "").isdigit()))

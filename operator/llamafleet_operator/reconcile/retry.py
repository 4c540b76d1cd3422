"""When to try building a SharedPrefix again after no pod could (pure: the caller passes the time).

A prefix fails to build for reasons that last (longer than a slot's context) and for reasons that pass
(every slot busy at that moment, a pod restarting mid-warm). Both are retried, with exponential backoff:
a lasting failure then costs one tokenize every few minutes, and a passing one is over within seconds.
A new generation of the spec starts again at once, with the first delay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """Failed attempts in a row at one generation of one SharedPrefix, and when the next may run."""

    initial_s: float
    max_s: float
    generation: int | str | None = None
    """The revision (prefix_text.py): the generation, with the text's digest when it is referenced."""
    attempts: int = 0
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def failed(self, now: float) -> float:
        """Record a failed attempt at `now`; the delay before the next one (initial, doubled, capped)."""
        delay = min(self.max_s, self.initial_s * 2.0 ** self.attempts)
        self.attempts += 1
        self.next_at = now + delay
        return delay

    def succeeded(self) -> None:
        self.attempts, self.next_at = 0, 0.0

    def note(self, delay: float) -> str:
        """What the status says about the retry (no timestamp: the status changes only per attempt)."""
        return f"attempt {self.attempts}; trying again in {delay:.0f}s"


def backoff_for(table: dict[str, Backoff], uid: str, generation: int | str | None, *, initial_s: float,
                max_s: float) -> Backoff:
    """The record of `uid`, new when there is none or the spec changed since (a fresh start)."""
    current = table.get(uid)
    if current is None or current.generation != generation:
        current = table[uid] = Backoff(initial_s, max_s, generation)
    return current

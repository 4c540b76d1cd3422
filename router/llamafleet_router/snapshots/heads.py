"""What this replica remembers of heads between requests, so that first sight asks the index and the
pods less: heads the fleet has a snapshot of (for a few seconds), and heads too long for their pods."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from llamafleet_router.scheduling.framework import Branch, Decision
from llamafleet_router.snapshots.base import SnapshotMetrics
from llamafleet_router.snapshots.first_sight import HeadTooLong
from llamafleet_router.snapshots.flights import FlightKey

log = logging.getLogger(__name__)

KNOWN_TTL_S = 10.0  # how long "the fleet has a snapshot of this head" is trusted without a lookup
_KNOWN_MAX = 4096
_TOO_LONG_MAX = 4096  # heads remembered as too long for their pods (each warned about once)


class HeadMemory:
    def __init__(self, metrics: SnapshotMetrics) -> None:
        self._metrics = metrics
        self._known: dict[FlightKey, float] = {}  # head -> until when it is trusted to be known
        self._too_long: dict[FlightKey, int] = {}  # head -> its tokens, for heads found too long

    def is_known(self, key: FlightKey) -> bool:
        deadline = self._known.get(key)
        return deadline is not None and deadline > time.monotonic()

    def remember(self, key: FlightKey) -> None:
        """The fleet has a snapshot of this head now: no lookup for it for `KNOWN_TTL_S`."""
        if len(self._known) >= _KNOWN_MAX:
            now = time.monotonic()
            self._known = {k: d for k, d in self._known.items() if d > now}
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
        self._known[key] = time.monotonic() + KNOWN_TTL_S

    def exceeds(self, key: FlightKey, slot_context: int) -> bool:
        """Whether the head was tokenized already and found at least `slot_context` tokens long (0:
        unknown context, never)."""
        n_tokens = self._too_long.get(key)
        return n_tokens is not None and 0 < slot_context <= n_tokens

    def remember_too_long(self, key: FlightKey, model: str, exc: HeadTooLong) -> None:
        if key in self._too_long:
            return
        if len(self._too_long) >= _TOO_LONG_MAX:  # forget the oldest: it is warned about again
            del self._too_long[next(iter(self._too_long))]
        self._too_long[key] = exc.n_tokens
        log.warning("a head exceeds the slot context: not built, the request goes on as decided",
                    extra={"model": model, "head_tokens": exc.n_tokens, "slot_context": exc.slot_context})

    def too_long(self, model: str, decision: Decision) -> Decision:
        """The decision, branch `head_exceeds_context`, counted: llama-server will refuse the prompt."""
        self._metrics.head_too_long.labels(model).inc()
        return replace(decision, branch=Branch.HEAD_EXCEEDS_CONTEXT)

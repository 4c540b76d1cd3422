"""One request's timings as its client sees them, from its arrival at the gateway.

`upstream_ttft_seconds` starts when the request is forwarded to the pod, after scheduling and after any
restore or first-sight build the snapshot flow ran for it: a request that waited a minute for a build
shows a fast upstream TTFT. The clock here starts when the gateway received the request, so its
`ttft_seconds` and `request_seconds` include those waits. Labels are the model and the key's name
(`auth.ANONYMOUS` when auth is off), both bounded: key names come from the settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.proxy.relay import Outcome


@dataclass
class RequestClock:
    """Started when the request arrives; `answer_started` and `finished` observe each at most once."""

    metrics: RouterMetrics
    received: float = field(default_factory=time.perf_counter)
    _answered: bool = field(default=False, init=False)
    _finished: bool = field(default=False, init=False)

    def elapsed(self) -> float:
        return time.perf_counter() - self.received

    def answer_started(self, model: str, key: str) -> None:
        """The first byte of a successful answer goes to the client now."""
        if self._answered:
            return
        self._answered = True
        self.metrics.ttft_seconds.labels(model, key).observe(self.elapsed())

    def finished(self, model: str, key: str, outcome: Outcome) -> None:
        """The answer ended: its generated tokens are counted; its latency is observed when it was
        successful and complete (an abandoned or failed answer's time says nothing of the fleet's)."""
        if self._finished:
            return
        self._finished = True
        stats = outcome.stats
        if stats is not None and stats.predicted_n:
            self.metrics.output_tokens.labels(model, key).inc(stats.predicted_n)
        if outcome.status < 400 and outcome.completed and outcome.error is None:
            self.metrics.request_seconds.labels(model, key).observe(self.elapsed())

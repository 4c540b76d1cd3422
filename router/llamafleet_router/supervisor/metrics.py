"""The supervisor's own metrics, served after the workers' merged ones; their `worker` label says which
worker a series is about."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SupervisorMetrics:
    def __init__(self, registry: CollectorRegistry, workers: int) -> None:
        self.registry = registry
        p = "llamafleet_router_worker_"
        self.scrape_failures = Counter(
            p + "scrape_failures_total",
            "Scrapes of a worker's /metrics that got no answer, an error status or unparsable text; the "
            "worker was left out of that scrape.", ["worker"], registry=registry,
        )
        self.restarts = Counter(
            p + "restarts_total", "Workers started again after they exited without being asked to.",
            ["worker"], registry=registry,
        )
        self.ready = Gauge(
            p + "ready", "1 while the worker's process runs and has answered on its metrics port.",
            ["worker"], registry=registry,
        )
        self.configured = Gauge(p + "count", "Worker processes this gateway pod runs (--workers).",
                                registry=registry)
        self.configured.set(workers)
        for i in range(workers):  # every series from the first scrape on, zeros included
            self.scrape_failures.labels(str(i))
            self.restarts.labels(str(i))
            self.ready.labels(str(i)).set(0)

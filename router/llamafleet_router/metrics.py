"""Prometheus metrics of one router app, in a registry passed in (one per app, so tests build many apps).

Labels are bounded: model names, API key NAMES, HTTP status, action/branch names, pod URLs. Never a
prompt, a prompt hash or a key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:  # only a type here: discovery's modules import the metrics at run time
    from llamafleet_router.discovery.base import PodStatus

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: One call in this many of each scheduling plugin is observed. Seventeen histogram observations per
#: request (a lock and a bucket search each) were a sixth of the decision's cost; a sample of one in
#: eight still gives the distribution. The index lookup and the lease wait are observed every time.
PLUGIN_SAMPLE_EVERY = 8
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# A whole answer may take minutes (a long generation after a first-sight build).
_REQUEST_BUCKETS = (*_TTFT_BUCKETS, 300.0, 600.0)


class _Sampled:
    __slots__ = ("calls", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self.calls = 0


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        p = "llamafleet_router_"
        self.requests = Counter(
            p + "requests_total", "Requests answered, by model, API key name and HTTP status.",
            ["model", "key", "status"], registry=registry,
        )
        self.decisions = Counter(
            p + "decisions_total", "Scheduling decisions, by action and scoring branch.",
            ["action", "branch"], registry=registry,
        )
        self.predicted_cached_tokens = Counter(
            p + "predicted_cached_tokens_total",
            "Prompt tokens the index predicted the chosen slot already held (blocks x chars per block / "
            "chars per token).", ["model"], registry=registry,
        )
        self.actual_cached_tokens = Counter(
            p + "actual_cached_tokens_total", "Prompt tokens llama-server actually reused (timings.cache_n).",
            ["model"], registry=registry,
        )
        self.shared_cached_tokens = Counter(
            p + "server_shared_tokens_total",
            "Of the tokens llama-server reused, those a patched server shared from another slot's cells "
            "(source=attached, --slot-attach) or copied from a RAM prefix entry (source=ram_prefix, "
            "--cache-prefix).", ["model", "source"], registry=registry,
        )
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "Prompt tokens llama-server evaluated (timings.prompt_n).",
            ["model"], registry=registry,
        )
        self.predictions = Counter(
            p + "cache_predictions_total",
            "Predicted hit/miss against the server's cache_n: outcome is hit, miss, false_hit (predicted "
            "a hit, the server reused ~nothing: the index entry is dropped) or surprise_hit.",
            ["outcome"], registry=registry,
        )
        self.index_lookup_seconds = Histogram(
            p + "index_lookup_seconds", "Latency of prefix index lookups.", buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.lease_wait_seconds = Histogram(
            p + "lease_wait_seconds", "Time spent waiting for a slot lease.", buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.schedule_seconds = Histogram(
            p + "schedule_seconds", "Time to schedule one request (lookup, scoring, lease).",
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.upstream_ttft_seconds = Histogram(
            p + "upstream_ttft_seconds", "From forwarding to the first byte of the upstream's body.",
            ["model"], buckets=_TTFT_BUCKETS, registry=registry,
        )
        # What the client waits for, beside what the pod takes: the gap is the body read, scheduling, and
        # the restores and first-sight builds that run before forwarding. By key NAME (from the settings:
        # bounded), never by the key.
        self.ttft_seconds = Histogram(
            p + "ttft_seconds", "From the request's arrival at the gateway to the first byte of a successful "
            "answer sent to the client (includes restores and first-sight builds), by model and key name.",
            ["model", "key"], buckets=_TTFT_BUCKETS, registry=registry,
        )
        self.request_seconds = Histogram(
            p + "request_seconds", "From the request's arrival at the gateway to the end of a successful "
            "answer (read from the pod to its end), by model and key name.",
            ["model", "key"], buckets=_REQUEST_BUCKETS, registry=registry,
        )
        self.output_tokens = Counter(
            p + "output_tokens_total", "Tokens generated for the answers relayed (timings.predicted_n, else "
            "usage), by model and key name.", ["model", "key"], registry=registry,
        )
        self.index_degraded = Gauge(
            p + "index_degraded", "1 while the prefix index is unreachable and routing falls back.",
            registry=registry,
        )
        self.index_errors = Counter(
            p + "index_errors_total", "Failed index operations, by operation.", ["op"], registry=registry,
        )
        self.in_flight = Gauge(
            p + "in_flight", "Requests being proxied, per pod.", ["pod"], registry=registry,
        )
        self.upstream_retries = Counter(
            p + "upstream_retries_total", "Requests re-scheduled after a pod refused the connection.",
            registry=registry,
        )
        self.stream_errors = Counter(
            p + "stream_errors_total", "Streams that failed midway (an SSE error event was sent).",
            registry=registry,
        )
        self.client_disconnects = Counter(
            p + "client_disconnects_total", "Responses the client abandoned before the end.",
            registry=registry,
        )
        self.pods_up = Gauge(p + "pods_up", "Pods currently routable.", registry=registry)
        self.known_tools_reused = Counter(
            p + "known_tools_reused_total", "Request bodies whose `tools` were a list learned before, "
            "found by their bytes and not parsed again (api/known_tools.py).", registry=registry,
        )
        self.known_tool_lists = Gauge(
            p + "known_tool_lists", "Tool lists learned and kept now, all tenant groups together.",
            registry=registry,
        )
        self.model_conflicts = Gauge(
            p + "model_conflicts", "Model names that several fleets report and no `model_fleets` entry "
            "assigns: refused (503 model_conflict) until one does.", registry=registry,
        )
        self.members_ignored = Gauge(
            p + "members_ignored", "Fleet members ignored because their address is outside "
            "member_networks (or not an IP literal), their ports are invalid, or (with a membership key) "
            "their signature is missing or wrong, by reason.",
            ["reason"], registry=registry,
        )
        self.pod_speed = Gauge(
            p + "pod_speed", "What the cost model learned of each pod from its answers, by figure "
            "(prefill_tokens_per_s, small_batch_tokens_per_s, restore_bytes_per_s, ...).",
            ["pod", "figure"], registry=registry,
        )
        self.pod_slot_context = Gauge(
            p + "pod_slot_context_tokens", "The per-slot context each pod reported (/props n_ctx: what "
            "llama-server allocated, after any cap to the model's training context), by pod and model.",
            ["pod", "model"], registry=registry,
        )
        self._slot_contexts: dict[tuple[str, str], int] = {}  # what the gauge shows now
        self.plugin_seconds = Histogram(
            p + "plugin_seconds", "Latency of each scheduling plugin, by point (producer, filter, scorer, "
            f"picker, lease), plugin type and name; sampled: one call in {PLUGIN_SAMPLE_EVERY} per plugin.",
            ["point", "type", "name"], buckets=_LATENCY_BUCKETS, registry=registry,
        )

        # Per plugin: its histogram child (`labels()` resolves and locks on every call) and its calls.
        self._plugin_children: dict[tuple[str, str, str], _Sampled] = {}

    def scheduler_hook(self, point: str, plugin_type: str, name: str, seconds: float) -> None:
        """The scheduler's `metrics_hook`: a sample of every plugin's latency, plus the index lookup
        (the `prefix-lookup` producer) and the slot lease wait on their own histograms, every time."""
        if point == "producer" and plugin_type == "prefix-lookup":
            self.index_lookup_seconds.observe(seconds)
        elif point == "lease":
            self.lease_wait_seconds.observe(seconds)
        key = (point, plugin_type, name)
        sampled = self._plugin_children.get(key)
        if sampled is None:
            sampled = self._plugin_children[key] = _Sampled(self.plugin_seconds.labels(*key))
        if sampled.calls % PLUGIN_SAMPLE_EVERY == 0:
            sampled.child.observe(seconds)
        sampled.calls += 1

    def show_slot_contexts(self, pods: Iterable[PodStatus]) -> None:
        """Set the slot-context gauge to these pods' reports; pods gone (or restarted with another
        model) leave it, so its labels stay those of the fleet. Unchanged: nothing is touched."""
        shown = {(p.endpoint.url, p.props.model): p.props.n_ctx
                 for p in pods if p.props is not None and p.props.n_ctx > 0}
        if shown == self._slot_contexts:
            return
        for labels in self._slot_contexts.keys() - shown.keys():
            self.pod_slot_context.remove(*labels)
        for labels, n_ctx in shown.items():
            if self._slot_contexts.get(labels) != n_ctx:
                self.pod_slot_context.labels(*labels).set(n_ctx)
        self._slot_contexts = shown

    def show_speeds(self, pod: str, figures: Mapping[str, float]) -> None:
        for figure, value in figures.items():
            self.pod_speed.labels(pod, figure).set(value)

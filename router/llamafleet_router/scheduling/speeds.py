"""What each pod really computes and restores at: speeds learned from its own answers (pure state).

The cost model's parameters (`costs.ActionCosts`) are reference figures, but the pods of a fleet differ
(GPU or CPU, model size, threads, load), and they are what a decision weighs. Every answer carries
llama-server's `timings` (tokens computed and the milliseconds it took), and every restore is timed,
so the gateway learns per pod:

- the full-batch prefill rate, in tokens per second;
- the small-batch rate (batches below `min_batch_tokens`), in tokens per second at
  `small_batch_context` tokens of context, the form the cost model takes it in (the per-row kernel
  slows in proportion to the context);
- how much slower or faster than the model predicts its restores and pulls are (one factor each,
  applied to both the per-byte rate and the fixed overhead, so small files learn as well as big ones).

An answer's tokens are split into the batches the server computed them in (`costs.server_cuts`). Its
time teaches the small-batch rate when every batch was small (below `min_batch_tokens`), and the
full-batch rate when it computed at least `FULL_SAMPLE_TOKENS` in full batches, once the small batches'
current estimate is taken off (when that leaves most of the time). Each figure is an
exponentially weighted average and replaces the configured one after `min_samples` observations. The
times include whatever else the pod was doing meanwhile (other slots' batches): that is the cost a
decision pays too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Endpoint
from llamafleet_router.scheduling.costs import (
    ActionCosts,
    batches,
    load_seconds,
    prefill_seconds,
    prompt_chars,
    pull_seconds,
    server_cuts,
    small_batch,
)

# The full-batch rate is what weighs computing thousands of tokens against a restore; a few dozen
# tokens (a question after a hit) run latency-bound even on a GPU, so they would teach it a rate ten
# times too slow. Only answers computing at least this many tokens in full batches teach it.
FULL_SAMPLE_TOKENS = 512
_MOVE = 0.05  # a figure that moved less than this since the costs were built does not rebuild them
# A learned figure stays within this factor of the configured one: one pathological answer (a pod
# stalled by the host) must not make a pod look 1,000x slower for the next dozen decisions.
_MAX_FACTOR = 50.0


@dataclass(slots=True)
class _Average:
    value: float = 0.0
    n: int = 0

    def add(self, sample: float, alpha: float) -> None:
        self.value = sample if self.n == 0 else (1 - alpha) * self.value + alpha * sample
        self.n += 1


@dataclass(slots=True)
class _Pod:
    full: _Average = field(default_factory=_Average)  # tokens/s
    small: _Average = field(default_factory=_Average)  # tokens/s at the reference context
    restore: _Average = field(default_factory=_Average)  # observed / predicted seconds
    transfer: _Average = field(default_factory=_Average)  # observed / predicted seconds
    costs: ActionCosts | None = None  # the base with the learned figures; None after a change


class SpeedBook:
    """Per-pod speeds over the configured `base`; `costs(uid)` is what the action choice uses."""

    def __init__(
        self, base: ActionCosts, *, alpha: float = 0.3, min_samples: int = 2, max_pods: int = 4096
    ) -> None:
        self.base = base
        self.alpha = alpha
        self.min_samples = min_samples
        self._max_pods = max_pods
        self._pods: dict[str, _Pod] = {}

    def costs(self, pod_uid: str) -> ActionCosts:
        """The base with this pod's learned figures, where it has enough observations."""
        pod = self._pods.get(pod_uid)
        if pod is None:
            return self.base
        if pod.costs is None:
            pod.costs = self.base.model_copy(update=self._learned(pod))
        return pod.costs

    def learned(self, pod_uid: str) -> dict[str, float]:
        """The figures learned for `pod_uid` so far (those with enough observations): for metrics."""
        pod = self._pods.get(pod_uid)
        return {} if pod is None else {k: float(v) for k, v in self._learned(pod).items()}

    def observe_prompt(
        self, endpoint: Endpoint, prompt: PromptIdentity, *, cached: int, computed: int, seconds: float
    ) -> bool:
        """One answer: `computed` prompt tokens after `cached` ones took `seconds` (llama-server's
        `prompt_n`, `cache_n` and `prompt_ms`). True when the pod's costs changed."""
        if computed <= 0 or seconds <= 0 or cached < 0:
            return False
        costs = self.costs(endpoint.pod.uid)
        end = cached + computed
        # The cuts are estimated from characters; anchor them to the real end of the prompt, which is
        # where the ones that matter (the last user message, 4 tokens before the end) are close to.
        estimated_end = prompt_chars(prompt) / costs.chars_per_token
        cuts = tuple(end - (estimated_end - c) for c in server_cuts(prompt, endpoint, costs))
        sizes = batches(cached, end, cuts)
        small = [n for n in sizes if small_batch(n, costs)]
        full = sum(sizes) - sum(small)
        if full <= 0 and small:
            pod = self._pod(endpoint.pod.uid)
            pod.small.add(sum(small) * (end / costs.small_batch_context) / seconds, self.alpha)
        elif full >= FULL_SAMPLE_TOKENS:
            rest = seconds - sum(prefill_seconds(n, costs, context=end) for n in small)
            if rest < 0.5 * seconds:
                return False  # the small batches' estimate is most of it: nothing reliable to learn
            pod = self._pod(endpoint.pod.uid)
            pod.full.add(full / rest, self.alpha)
        else:
            return False
        return self._moved(pod)

    def observe_restore(self, pod_uid: str, *, size_bytes: int, seconds: float, pull: bool = False) -> bool:
        """A restore of a `size_bytes` file into a slot of `pod_uid` (`pull`: a pull of it onto the pod)
        took `seconds`. Compared with what the configured figures predict, never the learned ones, so
        the factor does not chase itself."""
        predicted = (pull_seconds if pull else load_seconds)(size_bytes, self.base)
        if size_bytes < 0 or seconds <= 0 or predicted <= 0:
            return False
        pod = self._pod(pod_uid)
        (pod.transfer if pull else pod.restore).add(seconds / predicted, self.alpha)
        return self._moved(pod)

    def _moved(self, pod: _Pod) -> bool:
        """Whether a learned figure moved by more than `_MOVE` from the costs built last; if so, they are
        built again at the next decision. Rebuilding after every answer cost each request a model copy."""
        if pod.costs is None:
            return True
        built = pod.costs
        if any(abs(value / getattr(built, name) - 1) > _MOVE for name, value in self._learned(pod).items()):
            pod.costs = None
            return True
        return False

    def _pod(self, uid: str) -> _Pod:
        pod = self._pods.get(uid)
        if pod is None:
            if len(self._pods) >= self._max_pods:  # pods come and go: the oldest entry goes first
                self._pods.pop(next(iter(self._pods)))
            pod = self._pods[uid] = _Pod()
        return pod

    def _learned(self, pod: _Pod) -> dict[str, Any]:
        base, enough, update = self.base, self.min_samples, {}
        if pod.full.n >= enough:
            update["prefill_tokens_per_s"] = _bounded(pod.full.value, base.prefill_tokens_per_s)
        if pod.small.n >= enough:
            update["small_batch_tokens_per_s"] = _bounded(pod.small.value, base.small_batch_tokens_per_s)
        if pod.restore.n >= enough:
            k = _bounded(pod.restore.value, 1.0)
            update["restore_bytes_per_s"] = base.restore_bytes_per_s / k
            update["restore_overhead_s"] = base.restore_overhead_s * k
        if pod.transfer.n >= enough:
            k = _bounded(pod.transfer.value, 1.0)
            update["transfer_bytes_per_s"] = base.transfer_bytes_per_s / k
            update["transfer_overhead_s"] = base.transfer_overhead_s * k
        return update


def _bounded(value: float, reference: float) -> float:
    return min(max(value, reference / _MAX_FACTOR), reference * _MAX_FACTOR)

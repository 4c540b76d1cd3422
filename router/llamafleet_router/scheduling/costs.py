"""The cost model the action choice weighs: how long computing or restoring a prompt's part takes.

Deliberately linear and pure (prefill is superlinear in practice, so it favours computing slightly;
that errs on the side of not moving files around):

    restore_s = size_bytes / restore_bytes_per_s + restore_overhead_s
                (+ size_bytes / transfer_bytes_per_s + transfer_overhead_s when on another pod)
    compute_s(tokens) = the sum, over the batches the server computes the tokens in (`server_cuts`), of
                        batch / prefill_tokens_per_s
                        (batch / small_batch_tokens_per_s when 0 < batch < min_batch_tokens)

Why a small-batch rate: on llama.cpp's CPU backend a prompt batch of fewer than 64 new tokens takes the
per-row attention kernel, at about decoding speed (`llamafleet_core.devices`), so on a CPU fleet a
restore that leaves 140 tokens to compute beats one that leaves 20. GPU backends have no such cliff,
and neither has the CPU backend without flash attention (how CPU fleets run): keep 0 there.
`llamafleet up` sets `devices.CPU_MIN_BATCH_TOKENS` when its llama-server lists no GPU device and the
fleet runs flash attention.

The rate applies per batch, and on pods that checkpoint (hybrid or SWA models) llama-server cuts the
prompt into several batches (`server_cuts`): there the question always runs in a batch of its own, so
the session-prefix snapshot, which leaves nothing before it, beats any earlier stage.

The defaults are reference figures (docs/design.md, "Cost model"); each pod's own are learned from its
answers (speeds.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from llamafleet_core.prefix.identity import PromptIdentity
from llamafleet_core.types import Endpoint, SnapshotRef


class ActionCosts(BaseModel):
    """Parameters of the action choice (the `decision:` section of the scheduling config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    restore_enabled: bool = True
    chars_per_token: float = Field(default=4.0, gt=0)  # measured ~4.5 on agent tool JSON; 4 is conservative
    # Where an unknown pod starts: a tiny model's CPU rate, the middle of the band learned figures stay
    # in (speeds.py). For an unknown pod it only weighs restore against compute, where any figure in
    # that band has a restore of a head win; first-sight waits assume a slower figure of their own
    # (`snapshots/waits.py`, UNKNOWN_POD_PREFILL_TOKENS_PER_S).
    prefill_tokens_per_s: float = Field(default=2000.0, gt=0)
    restore_bytes_per_s: float = Field(default=500e6, gt=0)  # local file -> slot
    restore_overhead_s: float = Field(default=0.01, ge=0)
    transfer_bytes_per_s: float = Field(default=100e6, gt=0)  # agent-to-agent pull
    transfer_overhead_s: float = Field(default=0.05, ge=0)
    min_batch_tokens: int = Field(default=0, ge=0)  # below it, prefill runs at the small-batch rate
    # ~decode speed (the per-row kernel) at `small_batch_context` tokens of context; per-row attention
    # slows in proportion to the context, so a 2.7K-token prompt's small batch runs ~5x faster.
    small_batch_tokens_per_s: float = Field(default=100.0, gt=0)
    small_batch_context: int = Field(default=14_000, gt=0)
    # Learn each pod's prefill, restore and pull speeds from its answers (speeds.py); the figures above
    # are then only where a pod starts.
    learn_speeds: bool = True


# Token counts here are estimates from characters (`chars_per_token`). The text right before and after
# a session prefix's end (a date line, chat markup, a short question) runs up to ~4.8 characters per
# token, so an estimate must clear the cliff by this factor before a batch counts as full (a stage
# estimated just above the cliff can hold fewer real tokens, and pay the small-batch rate).
_CLIFF_MARGIN = 1.2


def small_batch(tokens: float, costs: ActionCosts) -> bool:
    """Whether a batch of `tokens` (estimated, > 0) new tokens would run below the cliff."""
    return 0 < tokens < costs.min_batch_tokens * _CLIFF_MARGIN


def prefill_seconds(tokens: float, costs: ActionCosts, context: float | None = None) -> float:
    """Estimated time to compute `tokens` (estimated) new prompt tokens in one batch, after about
    `context` tokens (None: the small-batch rate's own reference context). See the module docstring
    for the small-batch rate."""
    if tokens <= 0:
        return 0.0
    if small_batch(tokens, costs):
        scale = 1.0 if context is None else max(context, 1.0) / costs.small_batch_context
        return tokens * scale / costs.small_batch_tokens_per_s
    return tokens / costs.prefill_tokens_per_s


# On a pod it checkpoints (recurrent or SWA memory: `Endpoint.resume_anywhere` False), llama-server ends
# a prompt batch where the last user message starts (chat requests: the template's message delimiters)
# and 4 + n_ubatch and 4 tokens before the prompt's end, to save a checkpoint at each (server-context.cpp,
# llama.cpp PR 20288); in chat requests the question is a batch of its own.
CHECKPOINT_TAIL_TOKENS = 4
SERVER_N_UBATCH = 512  # llama-server's default `--ubatch-size`; the pods do not change it


def server_cuts(prompt: PromptIdentity, endpoint: Endpoint, costs: ActionCosts) -> tuple[float, ...]:
    """Where (in estimated tokens) llama-server ends a batch of this prompt on this pod, past the
    batch-size limit: nowhere on attention-only pods; see above for pods that checkpoint."""
    if endpoint.resume_anywhere:
        return ()
    end = prompt_chars(prompt) / costs.chars_per_token
    cuts = [end - CHECKPOINT_TAIL_TOKENS, end - CHECKPOINT_TAIL_TOKENS - SERVER_N_UBATCH]
    # Only a prompt rendered with the model's template has the server's message delimiters where we
    # think; a completions prompt has none.
    if prompt.rendered_by == "template" and prompt.session_prefix_chars > 0:
        cuts.append(prompt.session_prefix_chars / costs.chars_per_token)
    return tuple(cuts)


def batches(start: float, end: float, cuts: tuple[float, ...]) -> list[float]:
    """The sizes of the batches computing tokens `start`..`end` when the server ends one at each cut."""
    sizes, at = [], start
    for cut in sorted(c for c in cuts if start < c < end):
        sizes.append(cut - at)
        at = cut
    if end > at:
        sizes.append(end - at)
    return sizes


def prompt_chars(prompt: PromptIdentity) -> int:
    """The rendered prompt's length in characters."""
    return len(prompt.text)


def load_seconds(size_bytes: float, costs: ActionCosts) -> float:
    """Estimated time for llama-server to load a `size_bytes` snapshot file into a slot."""
    return size_bytes / costs.restore_bytes_per_s + costs.restore_overhead_s


def pull_seconds(size_bytes: float, costs: ActionCosts) -> float:
    """Estimated time for a pod's agent to pull a `size_bytes` snapshot from a peer's agent."""
    return size_bytes / costs.transfer_bytes_per_s + costs.transfer_overhead_s


def restore_seconds(snapshot: SnapshotRef, remote: bool, costs: ActionCosts) -> float:
    """Estimated time to get `snapshot` into a slot (pull first when it lives on another pod)."""
    seconds = load_seconds(snapshot.size_bytes, costs)
    if remote:
        seconds += pull_seconds(snapshot.size_bytes, costs)
    return seconds

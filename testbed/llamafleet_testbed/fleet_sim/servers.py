"""Simulated llama-servers for the fleet simulator: what each slot holds, and how long a request takes.

A slot holds the block chain of the last prompt it computed (llama-server keeps a slot's cells until
another prompt overwrites them); a request reuses the blocks its prompt shares with them from the start,
as `timings.cache_n` would say, and computes the rest. Its time is the server's per-request floor
(render and tokenize of the whole prompt), the computed tokens at the prefill rate and the answer at
the decode rate. The figures are the router's own cost-model defaults (`scheduling/costs.py`), so the
simulation and the scheduler price a prefill alike; a run can give others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llamafleet_router.scheduling.costs import ActionCosts

_COSTS = ActionCosts()


@dataclass(frozen=True)
class ServerTiming:
    prefill_tokens_per_s: float = _COSTS.prefill_tokens_per_s
    decode_tokens_per_s: float = 40.0  # one session's decode on a loaded GPU pod, per slot
    floor_s: float = 0.05  # render + tokenize of a ~14K-token prompt (bench_server_floor.py: ~100 ms here)
    chars_per_token: float = _COSTS.chars_per_token


@dataclass(frozen=True, slots=True)
class Served:
    """What one request cost its slot."""

    cached_tokens: int
    computed_tokens: int
    done_at: float


def shared_blocks(held: Sequence[str], blocks: Sequence[str]) -> int:
    """How many leading blocks two chains share (pure)."""
    n = 0
    for a, b in zip(held, blocks, strict=False):
        if a != b:
            break
        n += 1
    return n


@dataclass
class SimSlot:
    blocks: tuple[str, ...] = ()
    busy_until: float = 0.0


@dataclass
class SimPod:
    """One pod: `slots` slots, each holding a chain; `uid` as discovery names it."""

    uid: str
    n_slots: int
    slots: list[SimSlot] = field(init=False)

    def __post_init__(self) -> None:
        self.slots = [SimSlot() for _ in range(self.n_slots)]

    def serve(self, slot: int, blocks: tuple[str, ...], text_chars: int, answer_tokens: int, now: float,
              timing: ServerTiming, block_chars: int) -> Served:
        """Run a request of `text_chars` characters (chain `blocks`) in `slot` from `now`."""
        held = self.slots[slot]
        start = max(now, held.busy_until)  # a request queued on a busy slot waits for it
        prompt_tokens = max(1, round(text_chars / timing.chars_per_token))
        cached = min(prompt_tokens - 1, round(shared_blocks(held.blocks, blocks) * block_chars
                                              / timing.chars_per_token))
        computed = prompt_tokens - cached
        seconds = (timing.floor_s + computed / timing.prefill_tokens_per_s
                   + answer_tokens / timing.decode_tokens_per_s)
        held.blocks, held.busy_until = blocks, start + seconds
        return Served(cached, computed, start + seconds)

    def busy(self, now: float) -> frozenset[int]:
        return frozenset(i for i, s in enumerate(self.slots) if s.busy_until > now)

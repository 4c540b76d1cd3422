"""The arithmetic of the seed table (pure): medians and spread, ratios, the perfect-cache minimum of
prefill tokens, greedy agreement, and KV bytes per token of a model."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """The median of repeated runs and how far they spread (min and max; n = runs)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        vals = sorted(float(v) for v in values)
        if not vals:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(vals), vals[0], vals[-1], len(vals))

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}

    def fmt(self, unit: str = "s", digits: int = 3) -> str:
        """`0.123 s (0.110-0.150)`; the range only when there were repeats."""
        if self.n == 0:
            return "n/a"
        text = f"{self.median:.{digits}f} {unit}".rstrip()
        if self.n > 1:
            text += f" ({self.low:.{digits}f}-{self.high:.{digits}f})"
        return text


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when undefined (a missing figure must not read as a huge gain)."""
    if denominator <= 0 or numerator != numerator or denominator != denominator:
        return float("nan")
    return numerator / denominator


def fmt_ratio(value: float) -> str:
    return "n/a" if value != value else f"{value:.1f}x"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def minimum_prefill(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens a perfect cache computes for these prompts in this order: every prompt's tokens past the
    longest prefix it shares with any earlier prompt. That is each distinct prefix once plus every
    session's own tail, the number of nodes of the prompts' token trie."""
    trie: dict[int, Any] = {}
    total = 0
    for tokens in prompts:
        node = trie
        for token in tokens:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                total += 1
            node = child
    return total


def agreement(got: Sequence[str], want: Sequence[str]) -> tuple[int, int]:
    """(positions equal, positions compared) of two greedy outputs: a missing or extra piece counts
    as a disagreement, so a shorter output cannot score 100%."""
    same = sum(1 for a, b in zip(got, want, strict=False) if a == b)
    return same, max(len(got), len(want))


def share(pairs: Iterable[tuple[int, int]]) -> float:
    same = total = 0
    for s, t in pairs:
        same += s
        total += t
    return same / total if total else float("nan")


@dataclass(frozen=True)
class KvShape:
    """What sets a model's per-token KV size: layers holding a KV cache, KV heads, head size, bytes."""

    attention_layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # f16 K and V caches (the fleets' pinned cacheTypeK/V)

    @property
    def bytes_per_token(self) -> int:
        return self.attention_layers * self.kv_heads * self.head_dim * 2 * self.bytes_per_value


def kv_shape(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, *, head_dim: int = 0,
             full_attention_interval: int = 1) -> KvShape:
    """Per-token KV of a model: hybrid (qwen35) models hold KV only in every `full_attention_interval`
    layer (the others keep a fixed-size recurrent state per slot, not per token)."""
    if arch == "qwen35":
        return KvShape(n_layer // full_attention_interval, n_head_kv, head_dim or n_embd // n_head)
    return KvShape(n_layer, n_head_kv, n_embd // n_head)


def restore_records(log_lines: Iterable[str]) -> list[dict[str, Any]]:
    """The gateway's "snapshot restored" events from its JSON log: which snapshot, how many tokens, from
    where (local file or pulled from a peer), llama-server's own load time (`restore_ms`) and the
    gateway's whole restore (`seconds`: the agent's checks and a pull included)."""
    out = []
    for line in log_lines:
        if '"snapshot restored"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        out.append({k: event.get(k) for k in ("snapshot", "n_tokens", "source", "restore_ms", "seconds")})
    return out


def restore_figures(restores: Sequence[dict[str, Any]], files: Sequence[dict[str, Any]],
                    tokens: int) -> dict[str, Spread]:
    """For a fleet's restores of local snapshots of about `tokens` tokens (within 10%: the headline
    prefix size): the snapshot file's size in MiB, llama-server's load time and the gateway's whole
    restore in ms."""
    sizes = {str(f["name"]).removesuffix(".bin"): int(f["bytes"]) for f in files}
    near = [r for r in restores if r.get("source") == "local" and r.get("restore_ms") is not None
            and abs(int(r.get("n_tokens") or 0) - tokens) <= tokens // 10]
    return {
        "mib": Spread.of(sizes[r["snapshot"]] / (1024 * 1024) for r in near if r.get("snapshot") in sizes),
        "server_ms": Spread.of(float(r["restore_ms"]) for r in near),
        "gateway_ms": Spread.of(1000 * float(r["seconds"]) for r in near if r.get("seconds") is not None),
    }

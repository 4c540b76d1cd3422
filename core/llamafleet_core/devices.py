"""Which offload devices a llama-server build sees, read from its `--list-devices` text (pure), and what
that means for the router's prefill cost model.

`llama-server --list-devices` prints `Available devices:` and then one `  NAME: description (N MiB, M MiB
free)` line per non-CPU device, or `  (none)`. It needs no model and exits at once, like `--help`.

Why the router cares: on the CPU backend, llama.cpp's flash-attention kernel is tiled only for a batch of
at least `GGML_FA_TILE_Q` = 64 new tokens; a smaller batch runs the per-row kernel, which reads the
whole KV cache once per new token. At long context this cliff is most of a restored session's time to
first token (docs/design.md, "On CPU pods with flash attention on", for the figures). The router
applies it per batch of the tail, cut where llama-server cuts it (on a hybrid pod a chat request's
question is a batch of its own; `scheduling/costs.py`, `server_cuts`).

Without flash attention there is no cliff: the attention is two matrix products that read the cache
once per batch; a whole prefill runs slower without it (docs/design.md, "CPU pods run flash attention
off"). A fleet computes a prefix once and then restores it, so on CPU pods everything it computes per
request is such a small batch: CPU fleets run flash attention off (`examples/local-fleet.yaml`) and the
rule is off for them too. With a GPU device the prompt runs
there, where no such cliff was measured, so the rule is off.
"""

from __future__ import annotations

import re

#: New prompt tokens a CPU pod needs in one request for llama.cpp's tiled attention path
#: (`GGML_FA_TILE_Q`); the scheduling config's `decision.min_batch_tokens`.
CPU_MIN_BATCH_TOKENS = 64

_HEADER = "Available devices:"
_DEVICE = re.compile(r"^\s+([^\s:][^:]*):\s")


def parse_devices(text: str) -> list[str] | None:
    """The device names `--list-devices` printed ([] for a CPU-only build); None when the text is not
    that output (a crash, a build without the flag), so that nothing is assumed."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _HEADER)
    except StopIteration:
        return None
    names = []
    for line in lines[start + 1:]:
        if line.strip() == "(none)":
            return []
        match = _DEVICE.match(line)
        if match is None:
            break
        names.append(match.group(1).strip())
    return names


def min_batch_tokens(devices: list[str] | None, flash_attention: str = "on") -> int | None:
    """The cost model's `min_batch_tokens` for a build with `devices` running pods with
    `flash_attention`: the CPU cliff when it has no device and flash attention is on, 0 otherwise, None
    when the devices are unknown (keep the configured value)."""
    if devices is None:
        return None
    return CPU_MIN_BATCH_TOKENS if not devices and flash_attention == "on" else 0

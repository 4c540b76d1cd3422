"""The tiny models' recipes: which models exist and everything that determines their bytes (pure).

Two architectures matter: attention-only (`qwen2`), whose snapshots are reusable up to any common
prefix, and hybrid (`qwen35`, gated delta net plus gated full attention), whose recurrent state can only
resume from exact saved points. The hyper-parameters are the ones measured to load (see
shared/reference/measured.md). Apart from the writer (`tinymodels`): this is data, the writer is
file I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

# Bump when the writer changes in a way the hyper-parameters do not show (names, init, key set).
RECIPE_VERSION = 1

TEMPLATE_TOOLS_FIRST = "Qwen3.5-4B.jinja"  # tools rendered before the system prompt
TEMPLATE_TOOLS_AFTER = "Qwen-Qwen3-0.6B.jinja"  # tools rendered after the system prompt


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a model file, except the vocab and template bytes (digested apart)."""

    name: str
    arch: str  # "qwen2" (attention-only) or "qwen35" (hybrid)
    vocab: str  # models/ggml-vocab-<vocab>.gguf
    template: str  # models/templates/<template>
    n_layer: int
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    context_length: int = 65536
    rope_freq_base: float = 1e6
    rms_eps: float = 1e-6
    seed: int = 1234
    # Hybrid (qwen35) only.
    head_dim: int = 16
    rope_dim: int = 8
    rope_sections: tuple[int, int, int, int] = (2, 1, 1, 0)
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16
    ssm_group_count: int = 2
    ssm_time_step_rank: int = 4
    ssm_inner_size: int = 64
    # The spread of the random weights. At 0.02 the logits are nearly uniform and hardly depend on the
    # context: fine for timing and cache tests, useless for telling a right KV cache from a wrong one.
    # The `-sharp` models draw them wider, so their greedy outputs follow the prompt.
    weight_scale: float = 0.02


SHARP_SCALE = 0.3
_DENSE = Recipe(name="tiny-dense", arch="qwen2", vocab="qwen2", template=TEMPLATE_TOOLS_FIRST, n_layer=2)
_HYBRID = Recipe(name="tiny-hybrid", arch="qwen35", vocab="qwen35", template=TEMPLATE_TOOLS_FIRST, n_layer=4)

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        _DENSE,
        _HYBRID,
        dataclasses.replace(_DENSE, name="tiny-dense-q3", template=TEMPLATE_TOOLS_AFTER),
        dataclasses.replace(_HYBRID, name="tiny-hybrid-q3", template=TEMPLATE_TOOLS_AFTER),
        dataclasses.replace(_DENSE, name="tiny-dense-sharp", weight_scale=SHARP_SCALE),
        dataclasses.replace(_HYBRID, name="tiny-hybrid-sharp", weight_scale=SHARP_SCALE),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(RECIPES)


def recipe_digest(recipe: Recipe, template_text: str, vocab_digest: str) -> str:
    """Digest of everything that determines the file's bytes (pure)."""
    fields = dataclasses.asdict(recipe)
    if fields["weight_scale"] == Recipe.weight_scale:
        del fields["weight_scale"]  # the field came later: the models written before it keep their digest
    material = json.dumps(
        {"version": RECIPE_VERSION, "recipe": fields,
         "template": template_text, "vocab": vocab_digest},
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]

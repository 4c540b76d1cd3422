"""Deterministic tiny GGUF models that a real llama-server loads and serves.

Why: the project's behaviour depends on what llama-server really does with its KV cache (prefix reuse,
slot save and restore, context checkpoints of hybrid models), so the tests need real servers serving
real models, yet nothing may be downloaded at run time. These models have random F32 weights (fixed
seed) and tiny layers, but the REAL Qwen tokenizer (copied from the vocab-only GGUF files in the
llama.cpp tree) and a real chat template, so prompts tokenize and render exactly as with a real model.

The recipes (which models, their hyper-parameters, the digest naming a file) are in
`tinymodel_recipes`; this module writes their GGUF files and caches them.

Files are cached under `cache_root()/models/<name>-<digest>.gguf`; the digest covers everything that
determines the bytes, so a changed recipe writes a new file and an unchanged one is reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from llamafleet_local.cache import cache_root, log
from llamafleet_testbed.llama_build import source_dir
from llamafleet_testbed.tinymodel_recipes import MODEL_NAMES, RECIPE_VERSION, RECIPES, Recipe, recipe_digest


def _is_recurrent(recipe: Recipe, layer: int) -> bool:
    """Mirrors llama.cpp's default for qwen35: every `full_attention_interval`-th layer is attention."""
    return recipe.arch == "qwen35" and (layer + 1) % recipe.full_attention_interval != 0


def tensor_shapes(recipe: Recipe, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor names and numpy shapes (ggml's dims reversed) that llama.cpp's loader expects (pure)."""
    e, ff = recipe.n_embd, recipe.n_ff
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e), "output_norm.weight": (e,)}
    if recipe.arch == "qwen2":
        shapes["output.weight"] = (n_vocab, e)  # qwen35 ties the output to token_embd instead
        kv = recipe.n_head_kv * (e // recipe.n_head)
        for i in range(recipe.n_layer):
            b = f"blk.{i}."
            shapes |= {
                b + "attn_norm.weight": (e,),
                b + "attn_q.weight": (e, e), b + "attn_q.bias": (e,),
                b + "attn_k.weight": (kv, e), b + "attn_k.bias": (kv,),
                b + "attn_v.weight": (kv, e), b + "attn_v.bias": (kv,),
                b + "attn_output.weight": (e, e),
                b + "ffn_norm.weight": (e,),
            }
            shapes |= _ffn(b, e, ff)
        return shapes
    if recipe.arch != "qwen35":
        raise ValueError(f"unknown tiny-model architecture {recipe.arch!r}")
    hd, heads, kv_heads = recipe.head_dim, recipe.n_head, recipe.n_head_kv
    key_dim = recipe.ssm_state_size * recipe.ssm_group_count
    value_dim = recipe.ssm_state_size * recipe.ssm_time_step_rank
    conv_dim = 2 * key_dim + value_dim
    rank = recipe.ssm_time_step_rank
    for i in range(recipe.n_layer):
        b = f"blk.{i}."
        shapes |= {b + "attn_norm.weight": (e,), b + "post_attention_norm.weight": (e,)}
        if _is_recurrent(recipe, i):
            shapes |= {
                b + "attn_qkv.weight": (conv_dim, e),
                b + "attn_gate.weight": (value_dim, e),
                b + "ssm_conv1d.weight": (conv_dim, recipe.ssm_conv_kernel),
                b + "ssm_dt.bias": (rank,),
                b + "ssm_a": (rank,),
                b + "ssm_beta.weight": (rank, e),
                b + "ssm_alpha.weight": (rank, e),
                b + "ssm_norm.weight": (recipe.ssm_state_size,),
                b + "ssm_out.weight": (e, value_dim),
            }
        else:
            shapes |= {
                b + "attn_q.weight": (2 * heads * hd, e),  # query and output gate, interleaved per head
                b + "attn_k.weight": (kv_heads * hd, e),
                b + "attn_v.weight": (kv_heads * hd, e),
                b + "attn_output.weight": (e, heads * hd),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
            }
        shapes |= _ffn(b, e, ff)
    return shapes


def _ffn(prefix: str, e: int, ff: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "ffn_gate.weight": (ff, e), prefix + "ffn_up.weight": (ff, e),
            prefix + "ffn_down.weight": (e, ff)}


def _init(name: str, shape: tuple[int, ...], rng: Any, scale: float) -> Any:
    """Norms start at one, `ssm_a` negative (a decay), the rest small normal noise."""
    import numpy as np

    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith("ssm_a"):
        return -np.exp(rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _write_hparams(writer: Any, recipe: Recipe) -> None:
    writer.add_name(recipe.name)
    writer.add_context_length(recipe.context_length)
    writer.add_embedding_length(recipe.n_embd)
    writer.add_block_count(recipe.n_layer)
    writer.add_feed_forward_length(recipe.n_ff)
    writer.add_head_count(recipe.n_head)
    writer.add_head_count_kv(recipe.n_head_kv)
    writer.add_rope_freq_base(recipe.rope_freq_base)
    writer.add_layer_norm_rms_eps(recipe.rms_eps)
    writer.add_file_type(0)  # all F32
    if recipe.arch == "qwen35":
        writer.add_key_length(recipe.head_dim)
        writer.add_value_length(recipe.head_dim)
        writer.add_rope_dimension_count(recipe.rope_dim)
        writer.add_rope_dimension_sections(list(recipe.rope_sections))
        writer.add_full_attention_interval(recipe.full_attention_interval)
        writer.add_ssm_conv_kernel(recipe.ssm_conv_kernel)
        writer.add_ssm_state_size(recipe.ssm_state_size)
        writer.add_ssm_group_count(recipe.ssm_group_count)
        writer.add_ssm_time_step_rank(recipe.ssm_time_step_rank)
        writer.add_ssm_inner_size(recipe.ssm_inner_size)


def read_tokenizer(vocab_path: Path) -> dict[str, tuple[Any, int, int | None]]:
    """The `tokenizer.ggml.*` keys of a vocab GGUF: key -> (value, value type, array item type).

    GGUFReader takes tens of seconds over 300K strings on these machines, so the result is kept as
    JSON beside the models, keyed by the vocab file's digest (and in memory for the process).
    """
    return _read_tokenizer_cached(vocab_path, _file_digest(vocab_path))


@cache
def _read_tokenizer_cached(vocab_path: Path, digest: str) -> dict[str, tuple[Any, int, int | None]]:
    store = cache_root() / "models" / f"tokenizer-{digest[:16]}-v{RECIPE_VERSION}.json"
    if store.is_file():
        loaded: dict[str, list[Any]] = json.loads(store.read_text())
        return {k: (v[0], int(v[1]), v[2]) for k, v in loaded.items()}
    import gguf

    log(f"reading the tokenizer from {vocab_path.name}")
    fields = gguf.GGUFReader(vocab_path).fields
    result: dict[str, tuple[Any, int, int | None]] = {
        key: (field.contents(), int(field.types[0]), int(field.types[-1]) if len(field.types) > 1 else None)
        for key, field in fields.items()
        if key.startswith("tokenizer.ggml.")
    }
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = store.with_name(f".{store.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result))
    tmp.rename(store)
    return result


def write_model(recipe: Recipe, path: Path, vocab_path: Path, template_text: str) -> None:
    """Write the model to `path` (not atomically: `ensure_model` writes a temp file and renames)."""
    import gguf
    import numpy as np

    tokenizer = read_tokenizer(vocab_path)
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    writer = gguf.GGUFWriter(str(path), recipe.arch)
    _write_hparams(writer, recipe)
    for key, (value, vtype, sub_type) in tokenizer.items():
        writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                             sub_type=None if sub_type is None else gguf.GGUFValueType(sub_type))
    writer.add_chat_template(template_text)
    rng = np.random.default_rng(recipe.seed)
    for name, shape in tensor_shapes(recipe, n_vocab).items():
        writer.add_tensor(name, _init(name, shape, rng, recipe.weight_scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_path(name: str) -> Path:
    """Where `name` is (or will be) cached; raises KeyError for an unknown name."""
    recipe = RECIPES[name]
    models = source_dir() / "models"
    template_text = (models / "templates" / recipe.template).read_text()
    digest = recipe_digest(recipe, template_text, _file_digest(models / f"ggml-vocab-{recipe.vocab}.gguf"))
    return cache_root() / "models" / f"{name}-{digest}.gguf"


def ensure_model(name: str) -> Path:
    """Return the cached model file for `name`, writing it first when the recipe has none yet."""
    if name not in RECIPES:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(MODEL_NAMES)}")
    path = model_path(name)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test runs may ask at once: one writes, the others wait and reuse its file.
    with (path.parent / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        recipe = RECIPES[name]
        models = source_dir() / "models"
        log(f"writing tiny model {name} ({recipe.arch}) to {path}")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            write_model(recipe, tmp, models / f"ggml-vocab-{recipe.vocab}.gguf",
                        (models / "templates" / recipe.template).read_text())
            tmp.rename(path)  # atomic: a half-written model is never picked up
        finally:
            tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str]) -> int:
    names = argv or list(MODEL_NAMES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        log(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(MODEL_NAMES)}")
        return 2
    for name in names:
        print(ensure_model(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The tiny-model writer: deterministic bytes, a cache key that follows the recipe, real tokenizer
and template inside the file."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest

from llamafleet_testbed import tinymodel_recipes
from llamafleet_testbed.llama_build import source_dir
from llamafleet_testbed.tinymodel_recipes import MODEL_NAMES, RECIPES, recipe_digest
from llamafleet_testbed.tinymodels import ensure_model, model_path, read_tokenizer, tensor_shapes, write_model


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _vocab(name: str) -> Path:
    return source_dir() / "models" / f"ggml-vocab-{RECIPES[name].vocab}.gguf"


def _template(name: str) -> str:
    return (source_dir() / "models" / "templates" / RECIPES[name].template).read_text()


@pytest.mark.models
def test_write_is_byte_identical_when_written_twice(tmp_path: Path) -> None:
    """Same recipe, same bytes: and the cached file equals a fresh write, so a writer change that
    forgot to bump RECIPE_VERSION is caught here instead of serving a stale model."""
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_model(RECIPES["tiny-hybrid"], first, _vocab("tiny-hybrid"), _template("tiny-hybrid"))
    write_model(RECIPES["tiny-hybrid"], second, _vocab("tiny-hybrid"), _template("tiny-hybrid"))
    assert _sha256(first) == _sha256(second)
    assert _sha256(ensure_model("tiny-hybrid")) == _sha256(first)


@pytest.mark.models
def test_seed_changes_the_weights_when_everything_else_is_equal(tmp_path: Path) -> None:
    """The weights really come from the seeded generator (a writer that wrote zeros would pass the
    determinism test above)."""
    recipe = RECIPES["tiny-hybrid"]
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_model(recipe, a, _vocab("tiny-hybrid"), "t")
    write_model(dataclasses.replace(recipe, seed=recipe.seed + 1), b, _vocab("tiny-hybrid"), "t")
    assert a.stat().st_size == b.stat().st_size
    assert _sha256(a) != _sha256(b)


def test_cache_key_changes_when_any_part_of_the_recipe_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hyper-parameters, template text, vocab bytes and the writer version all feed the digest."""
    recipe = RECIPES["tiny-dense"]
    base = recipe_digest(recipe, "template", "vocab")
    assert recipe_digest(recipe, "template", "vocab") == base
    variants = {
        recipe_digest(dataclasses.replace(recipe, n_ff=256), "template", "vocab"),
        recipe_digest(dataclasses.replace(recipe, context_length=131072), "template", "vocab"),
        recipe_digest(dataclasses.replace(recipe, seed=7), "template", "vocab"),
        recipe_digest(recipe, "template!", "vocab"),
        recipe_digest(recipe, "template", "vocab2"),
    }
    monkeypatch.setattr(tinymodel_recipes, "RECIPE_VERSION", tinymodel_recipes.RECIPE_VERSION + 1)
    variants.add(recipe_digest(recipe, "template", "vocab"))
    assert base not in variants
    assert len(variants) == 6


@pytest.mark.models
def test_every_model_has_its_own_cache_path_when_names_differ() -> None:
    paths = {model_path(name) for name in MODEL_NAMES}
    assert len(paths) == len(MODEL_NAMES) == 6
    for name in MODEL_NAMES:
        assert model_path(name).name.startswith(f"{name}-")


def test_weight_scale_joined_the_digest_without_changing_the_models_written_before() -> None:
    """The default scale leaves a recipe's digest as it was; any other scale gives a new one."""
    recipe = RECIPES["tiny-dense"]
    base = recipe_digest(recipe, "template", "vocab")
    assert recipe_digest(dataclasses.replace(recipe, weight_scale=0.3), "template", "vocab") != base
    assert RECIPES["tiny-dense-sharp"].weight_scale > recipe.weight_scale


def test_unknown_model_name_is_refused_when_asked() -> None:
    with pytest.raises(KeyError, match="tiny-dense"):
        ensure_model("tiny-nonexistent")


def test_hybrid_layout_follows_full_attention_interval_when_listing_tensors() -> None:
    """Layer i is full attention when (i+1) % interval == 0, else gated delta net; no output tensor
    (tied to token_embd)."""
    shapes = tensor_shapes(RECIPES["tiny-hybrid"], n_vocab=1000)
    assert "output.weight" not in shapes
    assert [f"blk.{i}.ssm_a" in shapes for i in range(4)] == [True, True, True, False]
    assert shapes["blk.3.attn_q.weight"] == (2 * 4 * 16, 64)
    assert shapes["blk.0.attn_qkv.weight"] == (2 * 32 + 64, 64)


@pytest.fixture(scope="module")
def dense_reader() -> Any:
    """GGUFReader over an in-memory copy: slicing a numpy memmap 750K times (one per vocab string)
    is three times slower than slicing a plain array, and the parse is the same."""
    import gguf
    import numpy as np

    path = ensure_model("tiny-dense")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np, "memmap", lambda file, mode="r": np.fromfile(file, dtype=np.uint8))
        return gguf.GGUFReader(path)


@pytest.mark.models
@pytest.mark.slow
def test_written_file_carries_real_tokenizer_and_template_when_read_back(dense_reader: Any) -> None:
    """GGUFReader (gguf's own parser, not our writer) sees the vocab's tokenizer keys, the template
    text, a long context and exactly the tensors the recipe lists."""
    fields = dense_reader.fields
    expected = read_tokenizer(_vocab("tiny-dense"))
    tokenizer_keys = {k for k in fields if k.startswith("tokenizer.ggml.")}
    assert tokenizer_keys == set(expected)
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model"} <= tokenizer_keys
    for key, (value, _, _) in expected.items():
        assert fields[key].contents() == value, key
    tokens = fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 151936 and "<|im_start|>" in tokens
    assert fields["tokenizer.chat_template"].contents() == _template("tiny-dense")
    assert fields["general.architecture"].contents() == "qwen2"
    assert fields["qwen2.context_length"].contents() >= 65536
    written = {t.name: tuple(reversed([int(d) for d in t.shape])) for t in dense_reader.tensors}
    assert written == tensor_shapes(RECIPES["tiny-dense"], n_vocab=len(tokens))

"""The GGUF metadata reader and the resume kind it derives (what slots of a model can resume from)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from llamafleet_core.gguf_meta import GGUFError, model_resume_kind, read_metadata, resume_kind
from llamafleet_testbed.tinymodel_recipes import RECIPES
from tests.fixtures.llama import TinyModels


@pytest.mark.models
def test_metadata_matches_the_recipe_the_tiny_models_were_written_from(tiny_models: TinyModels) -> None:
    """Scalars and strings come back as written (the vocabulary, ~150K strings, is skipped)."""
    for name, path in (("tiny-dense", tiny_models.dense), ("tiny-hybrid", tiny_models.hybrid)):
        recipe = RECIPES[name]
        meta = read_metadata(path)
        arch = meta["general.architecture"]
        assert arch == recipe.arch
        shape = (meta[f"{arch}.block_count"], meta[f"{arch}.embedding_length"])
        assert shape == (recipe.n_layer, recipe.n_embd)
        assert meta[f"{arch}.attention.head_count_kv"] == recipe.n_head_kv
        assert meta["tokenizer.ggml.tokens"] is None
        assert len(read_metadata(path, arrays=True)["tokenizer.ggml.tokens"]) > 1000


@pytest.mark.models
def test_attention_only_model_resumes_anywhere_and_hybrid_only_at_checkpoints(
    tiny_models: TinyModels,
) -> None:
    assert model_resume_kind(tiny_models.dense) == "anywhere"
    assert model_resume_kind(tiny_models.hybrid) == "checkpoints"


def _write(path: Path, arch: str, extra: dict[str, int]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in extra.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("arch", "extra", "swa_full", "kind"), [
    ("llama", {"context_length": 4096}, False, "anywhere"),
    ("mamba2", {"ssm.state_size": 128, "ssm.conv_kernel": 4}, False, "checkpoints"),
    ("rwkv7", {"wkv.head_size": 64}, False, "checkpoints"),
    ("lfm2", {"shortconv.l_cache": 3}, False, "checkpoints"),
    ("gemma3", {"attention.sliding_window": 512}, False, "checkpoints"),
    ("gemma3", {"attention.sliding_window": 512}, True, "anywhere"),
])
def test_resume_kind_follows_the_state_keys_when_the_architecture_is_unknown_to_the_reader(
    tmp_path: Path, arch: str, extra: dict[str, int], swa_full: bool, kind: str,
) -> None:
    """Recurrent state and sliding windows are found by their keys, not by a list of architectures;
    `--swa-full` keeps the whole window, so such a model resumes anywhere again."""
    path = _write(tmp_path / "m.gguf", arch, extra)
    assert read_metadata(path)["general.architecture"] == arch
    assert model_resume_kind(path, swa_full=swa_full) == kind


def test_unreadable_files_raise_for_the_reader_and_fall_back_to_anywhere(tmp_path: Path) -> None:
    """A file that is not GGUF, a truncated one or a missing one never breaks the agent's start."""
    good = _write(tmp_path / "good.gguf", "mamba2", {"ssm.state_size": 16}).read_bytes()
    cases = {"text.gguf": b"not a model at all", "cut.gguf": good[: len(good) // 2], "empty.gguf": b""}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        if data:
            with pytest.raises(GGUFError):
                read_metadata(path)
        assert model_resume_kind(path) == "anywhere", name
    assert model_resume_kind(tmp_path / "missing.gguf") == "anywhere"
    assert resume_kind({}) == "anywhere"

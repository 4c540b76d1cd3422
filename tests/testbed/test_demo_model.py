"""`llamafleet demo --model NAME` and `bench --models`: the fleet on another named model (pure parts)."""

from __future__ import annotations

from pathlib import Path

from llamafleet_local.up.config import load_fleet
from llamafleet_testbed.bench.cli import model_names
from llamafleet_testbed.demo import DEFAULT_PREFIX_CHARS, fitting_prefix_chars, with_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-fleet.yaml"


def test_a_real_model_gets_its_name_and_slots_capped_at_its_training_context() -> None:
    config = load_fleet(EXAMPLE)
    assert config.fleet.spec.context_per_slot > 8192
    changed = with_model(config, "smollm2", 8192)
    spec = changed.fleet.spec
    assert (changed.local.model, spec.model.name, spec.model.file) == ("smollm2", "smollm2", "smollm2.gguf")
    assert spec.context_per_slot == 8192 and spec.n_ctx == spec.slots * 8192
    assert [p.spec.fleet_ref.name for p in changed.prefixes] == [changed.name]  # prefixes still match
    # Everything else is the example's, and the example itself is untouched.
    before = config.fleet.spec
    assert (spec.replicas, spec.flash_attention) == (before.replicas, before.flash_attention)
    assert config.local.model == "tiny-hybrid" and before.context_per_slot > 8192
    assert with_model(config, "tiny-dense", None).fleet.spec.context_per_slot == before.context_per_slot


def test_the_sessions_prefix_shrinks_to_half_a_small_slot() -> None:
    assert fitting_prefix_chars(36864) == DEFAULT_PREFIX_CHARS
    assert fitting_prefix_chars(8192) == 16384  # about 4K tokens of an 8K slot


def test_the_bench_takes_tiny_short_names_and_named_models() -> None:
    assert model_names("dense, hybrid,smollm2,tiny-dense-q3,") == (
        "tiny-dense", "tiny-hybrid", "smollm2", "tiny-dense-q3")

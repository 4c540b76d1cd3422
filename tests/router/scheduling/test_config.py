"""Config loading and validation against the registry."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from llamafleet_router.scheduling.config import DEFAULT_CONFIG, default_config, load_config
from llamafleet_router.scheduling.framework import PluginParams, PluginSpec
from llamafleet_router.scheduling.registry import register, register_builtin_plugins

MINIMAL_YAML = """
plugins:
  - {type: prefix-lookup}
  - {type: prefix-match, name: prefix}
  - {type: max-score}
profile:
  plugins:
    - {ref: prefix-lookup}
    - {ref: prefix, weight: 2}
    - {ref: max-score}
decision: {prefill_tokens_per_s: 500}
"""


def minimal(**changes: Any) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(MINIMAL_YAML)
    data.update(changes)
    return data


def test_loads_yaml_text_with_names_defaulting_to_type() -> None:
    cfg = load_config(MINIMAL_YAML)
    assert [p.ref_name for p in cfg.plugins] == ["prefix-lookup", "prefix", "max-score"]
    assert cfg.decision.prefill_tokens_per_s == 500
    assert cfg.decision.restore_enabled is True


def test_default_config_is_valid_and_weights_prefix_match_heaviest() -> None:
    weights = {e.ref: e.weight for e in default_config().profile.plugins if e.weight is not None}
    assert max(weights, key=lambda k: weights[k]) == "prefix-match"
    assert weights["free-slots"] < weights["session-affinity"] < weights["prefix-match"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["plugins"].append({"type": "no-such-plugin"}), "unknown plugin type 'no-such-plugin'"),
        (lambda d: d["profile"]["plugins"][1].pop("weight"), "scorer 'prefix' needs a weight"),
        (lambda d: d["profile"]["plugins"][0].update(weight=1), "producer 'prefix-lookup' takes no weight"),
        (lambda d: d["profile"]["plugins"].pop(2), "exactly one picker, found 0"),
        (
            lambda d: (
                d["plugins"].append({"type": "max-score", "name": "second"}),
                d["profile"]["plugins"].append({"ref": "second"}),
            ),
            "exactly one picker, found 2",
        ),
        (lambda d: d["profile"]["plugins"].append({"ref": "ghost"}), "unknown plugin name 'ghost'"),
        (lambda d: d["plugins"].append({"type": "max-score"}), "duplicate plugin name 'max-score'"),
        (lambda d: d["profile"]["plugins"].pop(0), "no producer in the profile writes 'lookup'"),
        (lambda d: d["plugins"][1].update(params={"nope": 1}), "bad params for 'prefix'"),
        (lambda d: d["profile"]["plugins"][1].update(weight=-1), "greater than or equal to 0"),
        (lambda d: d.update(extra_key=1), "Extra inputs are not permitted"),
    ],
)
def test_rejects_invalid_config(mutate: Any, message: str) -> None:
    """Every structural mistake is a ValidationError at load time, naming the problem."""
    data = minimal()
    mutate(data)
    with pytest.raises(ValidationError, match=message):
        load_config(data)


def test_rejects_bad_params_of_a_builtin_plugin() -> None:
    data = copy.deepcopy(DEFAULT_CONFIG)
    data["plugins"][4] = {"type": "bounded-load", "params": {"load_factor": 0.5}}
    with pytest.raises(ValidationError, match="bounded-load"):
        load_config(data)


def test_accepts_third_party_plugin_registered_before_loading() -> None:
    """Registration is explicit: a custom type is known only to the registry it was put into."""

    def factory(name: str, params: Any, handle: Any) -> object:
        raise AssertionError("validation must not build plugins")

    registry = register_builtin_plugins()
    register(registry, PluginSpec("custom-scorer", "scorer", PluginParams, factory))
    data = minimal()
    data["plugins"].append({"type": "custom-scorer"})
    data["profile"]["plugins"].append({"ref": "custom-scorer", "weight": 1})
    assert load_config(data, registry).plugin("custom-scorer").type == "custom-scorer"
    with pytest.raises(ValidationError, match="unknown plugin type 'custom-scorer'"):
        load_config(data)


def test_registering_a_type_twice_is_an_error() -> None:
    registry = register_builtin_plugins()
    with pytest.raises(ValueError, match="already registered"):
        register_builtin_plugins(registry)


def test_settings_override_the_pipelines_small_batch_cliff_when_given(tmp_path: Path) -> None:
    """`min_batch_tokens` in the router's settings (what `llamafleet up` derives from the binary's
    devices) wins over the pipeline file's `decision:`, and leaves every other decision field alone."""
    from llamafleet_core.index import InMemoryPrefixIndex, InMemorySlotLeases
    from llamafleet_router.app import build_scheduler
    from llamafleet_router.fleet.leases import ReplicaLeases
    from llamafleet_router.metrics import RouterMetrics
    from llamafleet_router.settings import RouterSettings

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({**DEFAULT_CONFIG, "decision": {"prefill_tokens_per_s": 500}}))
    leases = ReplicaLeases(InMemorySlotLeases(), "r")
    metrics = RouterMetrics(CollectorRegistry())
    for override, expected in ((68, 68), (None, 0)):
        settings = RouterSettings(config_file=path, min_batch_tokens=override)
        sched = build_scheduler(settings, InMemoryPrefixIndex(), leases, metrics)
        decision = sched.config.decision  # type: ignore[attr-defined]
        assert (decision.min_batch_tokens, decision.prefill_tokens_per_s) == (expected, 500)

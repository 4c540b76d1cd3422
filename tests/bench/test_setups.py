"""The seed table's setups run the servers they claim to: the fleet's pods with the fleet's own flash
attention setting (off on CPU), the plain baselines with it on (their fastest for full prefills)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet_local.up.config import parse_documents
from llamafleet_local.up.pods import layout, server_argv
from llamafleet_local.up.resolve import Resolved
from llamafleet_testbed.bench.plan import Plan, fleet_docs
from llamafleet_testbed.bench.setups import BASELINE_FLASH_ATTENTION, PlainPods


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("fleet_fa", ["off", "on"])
def test_plain_baselines_keep_flash_attention_on_whatever_the_fleet_runs(tmp_path: Path,
                                                                        fleet_fa: str) -> None:
    plan = Plan(flash_attention=fleet_fa)
    config = parse_documents(fleet_docs("tiny-hybrid", plan, []), "bench", tmp_path)
    spec = config.effective_spec(None)
    resolved = Resolved(Path("/bin/llama-server"), tmp_path / "m.gguf", None, spec)

    fleet_argv = server_argv(resolved.binary, spec, layout("bench", 0, tmp_path), resolved.model)
    assert _flag(fleet_argv, "-fa") == fleet_fa

    plain = PlainPods("plain", resolved, tmp_path / "plain", 2, sglang=False)
    for child in plain.children:
        assert _flag(child.argv, "-fa") == BASELINE_FLASH_ATTENTION == "on"
        # Everything else is the fleet's command line: same slots, context, KV types, checkpoints.
        for flag in ("-np", "-c", "-ctk", "-ctv", "--ctx-checkpoints", "-t"):
            if flag in fleet_argv:
                assert _flag(child.argv, flag) == _flag(fleet_argv, flag), flag


def test_the_bench_fleet_runs_flash_attention_off_by_default() -> None:
    """On CPU a restored session computes only a small batch, which the flash-attention kernel runs
    5-8x slower (core/llamafleet_core/devices.py)."""
    assert Plan().flash_attention == "off"
    fleet = fleet_docs("tiny-dense", Plan(), [])[0]
    assert fleet["spec"]["flashAttention"] == "off"

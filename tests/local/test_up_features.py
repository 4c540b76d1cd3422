"""`llamafleet up` detects what its llama-server binary accepts by running `--help` once, and renders the
patched flags through the same renderer as the operator."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from llamafleet_core import podspec
from llamafleet_core.features import ServerFeatures
from llamafleet_local.up import load_fleet
from llamafleet_local.up.pods import PodLayout, agent_args, server_argv
from llamafleet_local.up.resolve import resolve, server_features
from tests.core.test_features import PATCHED_HELP
from tests.local.test_up_config import FLEET, write

UNIFIED = FLEET.replace("contextPerSlot: 4096", "contextPerSlot: 4096\n  kvUnified: true")


def fake_binary(tmp_path: Path, help_text: str) -> Path:
    """A stand-in for a patched llama-server: prints `help_text` for `--help`, like the real one."""
    (tmp_path / "help.txt").write_text(help_text)
    path = tmp_path / "llama-server"
    path.write_text(f'#!/bin/sh\n[ "$1" = --help ] && exec cat "{tmp_path / "help.txt"}"\nexit 1\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.llama
def test_upstream_binary_accepts_no_patched_flag_so_auto_renders_none(
        tmp_path: Path, llama_server_bin: Path) -> None:
    features = server_features(llama_server_bin)
    assert features is not None and not features.slot_attach and not features.cache_prefix
    spec = load_fleet(write(tmp_path, UNIFIED)).fleet.spec
    pod = PodLayout("d-0", 1, 2, tmp_path, tmp_path)
    argv = server_argv(llama_server_bin, spec, pod, Path("/m"), features)
    assert "--slot-attach" not in argv and "--cache-prefix" not in argv
    assert "--slot-save-checkpoints" not in argv


def test_patched_binary_gets_the_flags_in_server_and_agent_when_auto(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path, PATCHED_HELP)
    features = server_features(binary)
    assert features == ServerFeatures(slot_attach=True, cache_prefix=True, slot_checkpoints=True)
    config = load_fleet(write(tmp_path, UNIFIED))
    pod = PodLayout("demo-0", 1234, 1235, tmp_path / "snap", tmp_path)
    argv = server_argv(binary, config.fleet.spec, pod, Path("/m.gguf"), features)
    assert argv == [str(binary), *podspec.llama_server_args(
        config.fleet.spec, model_path="/m.gguf", port=1234, slot_save_path=str(tmp_path / "snap"),
        host="127.0.0.1", attach=True, cache_prefix=True, snapshot_checkpoints=True)]
    assert argv[argv.index("--slot-save-checkpoints") + 1] == str(podspec.SNAPSHOT_CHECKPOINTS)
    assert "--attach" in agent_args(config.fleet.spec, pod, Path("/m.gguf"), "demo", tmp_path / "t", features)
    # Unknown (no features) keeps auto off.
    assert "--slot-attach" not in server_argv(binary, config.fleet.spec, pod, Path("/m.gguf"), None)


def test_binary_that_cannot_run_gives_unknown(tmp_path: Path) -> None:
    assert server_features(tmp_path / "missing") is None
    assert server_features(fake_binary(tmp_path, "segmentation fault\n")) is None


def test_resolve_detects_once_and_says_what_it_found(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path, PATCHED_HELP)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    text = UNIFIED.replace("model: tiny-dense", f"model: m.gguf\n  llamaServer: {binary}")
    said: list[str] = []
    resolved = resolve(load_fleet(write(tmp_path, text)), said.append)
    assert resolved.features is not None and resolved.features.slot_attach
    assert any("slot_attach, cache_prefix" in line for line in said), said
    sharing = "\n  prefixSharing: {attach: 'off', cachePrefix: 'off'}"
    off = text.replace("kvUnified: true", "kvUnified: true" + sharing)
    assert resolve(load_fleet(write(tmp_path, off)), said.append).features is None  # nothing to detect


def test_gateway_cliff_follows_the_binarys_device_list_and_stays_unset_when_unknown(tmp_path: Path) -> None:
    """`llamafleet up` runs `--list-devices`: no GPU gives the CPU cliff when the pods run flash attention,
    a GPU or flash attention off turns it off, and a binary
    whose output is not a device list leaves the pipeline's own value (None)."""
    from llamafleet_core.devices import CPU_MIN_BATCH_TOKENS
    from llamafleet_local.up.resolve import server_min_batch_tokens

    def binary(name: str, output: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "out.txt").write_text(output)
        path = folder / "llama-server"
        path.write_text(f'#!/bin/sh\n[ "$1" = --list-devices ] && exec cat "{folder / "out.txt"}"\nexit 1\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    cpu = binary("cpu", "Available devices:\n  (none)\n")
    assert server_min_batch_tokens(cpu) == CPU_MIN_BATCH_TOKENS
    assert server_min_batch_tokens(cpu, "off") == 0  # no flash attention, no tiled kernel to miss
    gpu = "Available devices:\n  CUDA0: NVIDIA L4 (22478 MiB, 22200 MiB free)\n"
    assert server_min_batch_tokens(binary("gpu", gpu)) == 0
    assert server_min_batch_tokens(binary("old", "error: unknown argument\n")) is None
    assert server_min_batch_tokens(tmp_path / "missing") is None


@pytest.mark.models
def test_a_sliding_window_model_keeps_per_slot_streams_on_a_patched_binary(tmp_path: Path) -> None:
    """llama-server attaches no slot of a sliding-window model, so `up` renders no --slot-attach and no
    unified pool for Gemma 3, and says why; the other patched flags stay."""
    from llamafleet_testbed.real_models import ensure_real_model

    ensure_real_model("gemma3-270m")
    binary = fake_binary(tmp_path, PATCHED_HELP)
    said: list[str] = []
    text = FLEET.replace("model: tiny-dense", f"model: gemma3-270m\n  llamaServer: {binary}")
    resolved = resolve(load_fleet(write(tmp_path, text)), said.append)
    assert resolved.features is not None and not resolved.features.slot_attach
    assert resolved.features.cache_prefix and resolved.features.slot_checkpoints
    assert not resolved.spec.kv_unified
    assert any("slot attach off: " in line and "sliding window" in line for line in said), said
    argv = server_argv(binary, resolved.spec, PodLayout("g-0", 1, 2, tmp_path, tmp_path), resolved.model,
                       resolved.features)
    assert "--slot-attach" not in argv and "-no-kvu" in argv and "--slot-save-checkpoints" in argv

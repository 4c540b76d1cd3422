"""`llama-server --list-devices` parsing, and the prefill cliff it implies for the router's cost model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamafleet_core.devices import CPU_MIN_BATCH_TOKENS, min_batch_tokens, parse_devices

# The format of common/arg.cpp's list: one line per non-CPU device, after a header.
GPU_LIST = """\
ggml_cuda_init: found 2 CUDA devices:
Available devices:
  CUDA0: NVIDIA L4 (22478 MiB, 22200 MiB free)
  CUDA1: NVIDIA L4 (22478 MiB, 22200 MiB free)
"""


def test_cpu_only_build_lists_no_device_and_gets_the_cpu_cliff() -> None:
    devices = parse_devices("load_backend: loaded CPU backend\nAvailable devices:\n  (none)\n")
    assert devices == []
    assert min_batch_tokens(devices) == CPU_MIN_BATCH_TOKENS


def test_gpu_build_lists_its_devices_and_turns_the_cliff_off() -> None:
    devices = parse_devices(GPU_LIST)
    assert devices == ["CUDA0", "CUDA1"]
    assert min_batch_tokens(devices) == 0


@pytest.mark.parametrize("text", ["", "error: invalid argument: --list-devices\n", "Segmentation fault\n"])
def test_other_output_tells_nothing_when_not_a_device_list(text: str) -> None:
    """An old build without the flag, or a crash: nothing is assumed, the configured value stands."""
    assert parse_devices(text) is None
    assert min_batch_tokens(None) is None


@pytest.mark.llama
def test_project_build_lists_its_devices_when_asked(llama_server_bin: Path) -> None:
    """The real binary's output parses (this machine has no GPU, so CI sees the CPU cliff)."""
    done = subprocess.run([str(llama_server_bin), "--list-devices"], capture_output=True, text=True,
                          timeout=60, check=False)
    devices = parse_devices(done.stdout + done.stderr)
    assert devices is not None, done.stdout + done.stderr
    assert min_batch_tokens(devices) in (0, CPU_MIN_BATCH_TOKENS)

"""Command lines of llama-server and the agent: exact argv, and every flag known to the pinned llama.cpp."""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest

from llamafleet_core import podspec
from llamafleet_core.crd.models import CacheType, LlamaFleetSpec


def spec(**overrides: Any) -> LlamaFleetSpec:
    base: dict[str, Any] = {
        "model": {"name": "tiny", "file": "tiny.gguf", "source": {"hostPath": "/srv/models"}},
        "image": "llama-server:test",
        "slots": 2,
        "contextPerSlot": 4096,
    }
    base.update(overrides)
    return LlamaFleetSpec.model_validate(base)


def server_args(s: LlamaFleetSpec, **kw: Any) -> list[str]:
    return podspec.llama_server_args(s, model_path="/m/tiny.gguf", port=8080, slot_save_path="/snap", **kw)


def test_server_argv_golden_when_per_slot_kv() -> None:
    """Per-slot streams: -c is slots * contextPerSlot, and the KV layout is spelled out in full; idle
    slots are never copied to RAM at each task launch (bench/bench_idle_slots.py)."""
    assert server_args(spec()) == [
        "-m", "/m/tiny.gguf", "-a", "tiny", "--host", "0.0.0.0", "--port", "8080",
        "-np", "2", "-c", "8192", "-no-kvu", "--no-cache-idle-slots",
        "-ctk", "f16", "-ctv", "f16", "-fa", "on", "--fit", "off",
        "--slot-save-path", "/snap", "--metrics", "--jinja",
    ]


def test_server_argv_golden_when_unified_with_attach_and_everything_set() -> None:
    """Unified KV: the pool is sized by contextTotal, idle slots stay in VRAM, attach and extras come last."""
    s = spec(
        kvUnified=True, contextTotal=6000, cacheTypeK="q8_0", cacheTypeV="q4_0", cacheRamMiB=0,
        ctxCheckpoints=128, threads=3, gpu={"count": 1}, prefixSharing={"attach": "on"},
        extraArgs=["--swa-full"],
    )
    assert server_args(s, api_key_file="/k", host="127.0.0.1", attach=True) == [
        "-m", "/m/tiny.gguf", "-a", "tiny", "--host", "127.0.0.1", "--port", "8080",
        "-np", "2", "-c", "6000", "-kvu", "--kv-unified-per-slot", "4096", "--no-cache-idle-slots",
        "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on", "--fit", "off", "-ngl", "all",
        "--slot-save-path", "/snap", "--metrics", "--jinja",
        "--cache-ram", "0", "--ctx-checkpoints", "128", "-t", "3", "--api-key-file", "/k",
        "--slot-attach", "--swa-full",
    ]


def test_unified_pool_defaults_to_slots_times_context_when_total_unset() -> None:
    assert spec(kvUnified=True).n_ctx == 2 * 4096


@pytest.mark.parametrize(
    ("mode", "unified", "supported", "expected"),
    [
        ("auto", True, True, True),
        ("auto", True, False, False),
        ("auto", False, True, False),  # attach shares cells of one pool: per-slot streams cannot
        ("off", True, True, False),
        ("on", True, False, True),  # an explicit `on` is honoured; an unpatched server then fails loudly
    ],
)
def test_attach_resolution(mode: str, unified: bool, supported: bool, expected: bool) -> None:
    s = spec(kvUnified=unified, prefixSharing={"attach": mode})
    assert podspec.attach_enabled(s, supported=supported) is expected


@pytest.mark.parametrize(
    ("mode", "unified", "supported", "expected"),
    [
        ("auto", None, True, True),  # unset: one pool on a patched image, to attach in
        ("auto", None, False, False),  # upstream or unknown image: per-slot streams, as before
        ("on", None, False, True),
        ("off", None, True, False),
        ("auto", False, True, False),
        ("off", True, False, True),
    ],
)
def test_kv_unified_unset_follows_attach(
        mode: str, unified: bool | None, supported: bool, expected: bool) -> None:
    s = spec(kvUnified=unified, prefixSharing={"attach": mode})
    assert podspec.unified_kv(s, attach_supported=supported) is expected
    resolved = podspec.for_image(s, attach_supported=supported)
    assert resolved.kv_unified is expected
    server = podspec.llama_server_args(resolved, model_path="/m", port=1, slot_save_path="/s")
    agent = podspec.agent_args(resolved, port=2, server_url="http://s", snapshot_dir="/s", model_path="/m")
    assert ("-kvu" in server, "--kv-unified" in agent, podspec.kv_settings(resolved)["kv_unified"]) == \
        (expected, expected, expected)


def test_a_pool_where_slots_attach_holds_the_head_once_plus_every_slots_own_context() -> None:
    s = spec(slots=3, contextPerSlot=16384, prefixSharing={"headTokens": 14000})
    patched = podspec.for_image(s, attach_supported=True)
    assert patched.n_ctx == 14000 + 3 * (16384 - 14000)
    server = podspec.llama_server_args(patched, model_path="/m", port=1, slot_save_path="/s", attach=True)
    assert server[server.index("-c") + 1] == str(patched.n_ctx)
    assert server[server.index("--kv-unified-per-slot") + 1] == "16384"  # a slot may still hold all
    # upstream pods, an explicit pool size, or no head size: the pool is not shrunk
    assert podspec.for_image(s, attach_supported=False).n_ctx == 3 * 16384
    assert podspec.for_image(spec(slots=3, contextPerSlot=16384, contextTotal=40000,
                                  prefixSharing={"headTokens": 14000}), attach_supported=True).n_ctx == 40000
    assert podspec.for_image(spec(slots=3, contextPerSlot=16384), attach_supported=True).n_ctx == 3 * 16384


@pytest.mark.parametrize(
    ("mode", "cache_ram", "supported", "expected"),
    [
        ("auto", None, True, True),
        ("auto", None, False, False),  # unknown or unsupported image: off, never a guess
        ("auto", 0, True, False),  # the RAM cache is off: there is nothing to keep an entry in
        ("off", None, True, False),
        ("on", None, False, True),
    ],
)
def test_cache_prefix_resolution(mode: str, cache_ram: int | None, supported: bool, expected: bool) -> None:
    s = spec(cacheRamMiB=cache_ram, prefixSharing={"cachePrefix": mode})
    assert podspec.cache_prefix_enabled(s, supported=supported) is expected


@pytest.mark.parametrize(
    ("sharing", "overrides", "expected"),
    [
        ({}, {}, True),  # cachePrefix auto with the RAM cache at its default
        ({"cachePrefix": "off"}, {"kvUnified": False}, False),  # attach auto cannot apply: per-slot streams
        ({"cachePrefix": "off"}, {}, True),  # kvUnified unset: unified where the image attaches
        ({"cachePrefix": "off"}, {"kvUnified": True}, True),
        ({"cachePrefix": "on", "attach": "on"}, {"kvUnified": True}, False),  # nothing left to detect
        ({"attach": "off"}, {"cacheRamMiB": 0}, False),
    ],
)
def test_detection_only_when_an_auto_flag_could_turn_on(
        sharing: dict[str, str], overrides: dict[str, Any], expected: bool) -> None:
    """Pods of other specs get no detector: they start exactly as before, also from shell-less images."""
    assert podspec.detects_features(spec(prefixSharing=sharing, **overrides)) is expected


def test_patched_flags_rendered_before_extra_args_when_enabled() -> None:
    s = spec(kvUnified=True, extraArgs=["--swa-full"])
    tail = server_args(s, attach=True, cache_prefix=True)[-3:]
    assert tail == ["--slot-attach", "--cache-prefix", "--swa-full"]
    assert "--cache-prefix" not in server_args(s) and "--slot-attach" not in server_args(s)


def test_invalid_prefix_sharing_rejected_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="cachePrefix: on needs the RAM prompt cache"):
        spec(cacheRamMiB=0, prefixSharing={"cachePrefix": "on"})
    with pytest.raises(ValueError, match="serverBinary"):
        spec(prefixSharing={"serverBinary": "llama-server; rm -rf /"})


def test_agent_argv_golden_carries_the_same_kv_layout_as_the_server() -> None:
    """The agent fingerprints snapshots with the settings llama-server was started with: same values."""
    s = spec(cacheTypeK="q8_0", cacheTypeV="q8_0", kvUnified=True,
             model={"name": "tiny", "file": "tiny.gguf", "sha256": "a" * 64, "source": {"pvc": "m"}},
             snapshots={"sizeLimit": "1Gi"})
    argv = podspec.agent_args(s, port=8090, server_url="http://127.0.0.1:8080", snapshot_dir="/snap",
                              model_path="/m/tiny.gguf", fleet="f", token_file="/t", attach=True)
    assert argv == [
        "--host", "0.0.0.0", "--port", "8090", "--server-url", "http://127.0.0.1:8080",
        "--snapshot-dir", "/snap", "--model-path", "/m/tiny.gguf", "--model-name", "tiny",
        "--slots", "2", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--flash-attn", "on",
        "--kv-unified", "--budget-bytes", str(int((1 << 30) * 0.9)), "--await-required",
        "--model-sha256", "a" * 64, "--fleet", "f", "--token-file", "/t", "--attach",
    ]
    server = server_args(s)
    assert server[server.index("-ctk") + 1] == argv[argv.index("--cache-type-k") + 1]
    assert server[server.index("-fa") + 1] == argv[argv.index("--flash-attn") + 1]
    assert podspec.kv_settings(s)["kv_unified"] is True and "-kvu" in server


def test_explicit_budget_wins_over_the_volume_share() -> None:
    assert podspec.snapshot_budget_bytes(spec(snapshots={"budgetBytes": 12345})) == 12345


def _declared_flags(arg_cpp: str) -> set[str]:
    """Every flag string declared in common/arg.cpp's `common_arg({...}, ...)` initializer lists."""
    flags: set[str] = set()
    for group in re.findall(r"\{\s*((?:\"-[^\"]+\"\s*,?\s*)+)\}", arg_cpp):
        flags.update(re.findall(r"\"(-[^\"]+)\"", group))
    return flags


@pytest.mark.llama
def test_every_emitted_flag_exists_in_the_llama_cpp_tree() -> None:
    """Flags we emit must exist in the pinned llama.cpp, except the patched build's attach flags."""
    from llamafleet_testbed.llama_build import source_dir

    declared = _declared_flags((source_dir() / "common" / "arg.cpp").read_text())
    assert "--slot-save-path" in declared and "--slot-attach" not in declared
    assert "--cache-prefix" not in declared
    s = spec(kvUnified=True, cacheRamMiB=0, ctxCheckpoints=8, threads=1, gpu={"count": 1},
             prefixSharing={"attach": "on"})
    argv = server_args(s, api_key_file="/k", attach=True, cache_prefix=True)
    emitted = {a for a in argv if a.startswith("-") and not a.lstrip("-").isdigit()}
    missing = emitted - declared - set(podspec.PATCHED_ONLY_FLAGS)
    assert not missing, f"flags unknown to llama.cpp: {sorted(missing)}"


@pytest.mark.llama
def test_cache_type_enum_equals_the_types_llama_cpp_accepts() -> None:
    """`cacheTypeK/V` allow exactly arg.cpp's `kv_cache_types` (by ggml type name), no more, no fewer."""
    from llamafleet_testbed.llama_build import source_dir

    text = (source_dir() / "common" / "arg.cpp").read_text()
    block = re.search(r"kv_cache_types\s*=\s*\{(.*?)\};", text, re.S)
    assert block is not None
    accepted = {t.lower() for t in re.findall(r"GGML_TYPE_(\w+)", block.group(1))}
    assert accepted == set(get_args(CacheType))

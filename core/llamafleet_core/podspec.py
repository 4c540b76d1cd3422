"""The command lines of llama-server and of the snapshot agent, derived from a fleet spec.

One renderer for both runtimes: the operator puts these argv lists into pod containers and the local
runtime (`llamafleet up`) runs them as processes, so a fleet behaves the same on a laptop and a cluster.

Every flag is checked against the pinned llama.cpp tree (`common/arg.cpp`) by a test, except the attach
flags of patched builds (`PATCHED_ONLY_FLAGS`). Settings that change the KV layout are always written
out, never left to the server's `auto`, because snapshots restore only between identical layouts:
`-fa on|off`, `-ctk/-ctv`, `-kvu`/`-no-kvu`, `-np`, and `--fit off` so that no pod shrinks `-c` on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Literal

from llamafleet_core.crd.base import quantity_bytes
from llamafleet_core.crd.fleet import LlamaFleetSpec

SERVER_PORT = 8080
AGENT_PORT = 8090
MODEL_DIR = "/models"
SNAPSHOT_DIR = "/snapshots"
SECRETS_DIR = "/var/run/secrets/llamafleet"

# Flags only a patched llama-server knows (the prefix-sharing proposal); upstream rejects them.
PATCHED_ONLY_FLAGS = ("--slot-attach", "--cache-prefix")
# Where the detector init container writes `llama-server --help` and the agent reads it: the pod's /tmp
# emptyDir, which both share. Not the snapshot folder: a claim there outlives the pod, and an old
# image's help text must never describe a new image.
SERVER_HELP_FILE = "/tmp/llamafleet/llama-server-help.txt"
# Share of the snapshot volume the agent may fill when no explicit budget is set: headroom for the file
# being written while the oldest one is evicted.
DEFAULT_BUDGET_SHARE = 0.9


def model_path(spec: LlamaFleetSpec, model_dir: str = MODEL_DIR) -> str:
    """Where the GGUF file is inside the pod (or the local model folder)."""
    return str(PurePosixPath(model_dir) / spec.model.file)


def unified_kv(spec: LlamaFleetSpec, *, attach_supported: bool) -> bool:
    """Resolve `kvUnified`: unset means one pool exactly where slots attach (`attach: on`, or `auto` on an
    image with --slot-attach), since attach shares cells within one pool; per-slot streams elsewhere."""
    if spec.kv_unified is not None:
        return spec.kv_unified
    mode = spec.prefix_sharing.attach
    return mode == "on" or (mode == "auto" and attach_supported)


def attach_enabled(spec: LlamaFleetSpec, *, supported: bool) -> bool:
    """Resolve `prefixSharing.attach`: `on` is honoured even if the image lacks it (the pod fails loudly)."""
    mode = spec.prefix_sharing.attach
    if mode == "on":
        return True
    return mode == "auto" and supported and unified_kv(spec, attach_supported=supported)


def for_image(spec: LlamaFleetSpec, *, attach_supported: bool) -> LlamaFleetSpec:
    """The spec with what depends on the image settled (pure): `kvUnified` (`unified_kv`), and where
    slots attach and `prefixSharing.headTokens` is set, the pool's size: the head once plus every slot's
    own context, since attached slots hold the head's cells once between them. Every renderer of a
    pod reads this spec, so the server, the agent's fingerprint and the fleet's config agree."""
    update: dict[str, object] = {"kv_unified": unified_kv(spec, attach_supported=attach_supported)}
    head = spec.prefix_sharing.head_tokens
    if head is not None and spec.context_total is None and attach_enabled(spec, supported=attach_supported):
        update["context_total"] = head + spec.slots * (spec.context_per_slot - head)
    return spec.model_copy(update=update)


def cache_prefix_enabled(spec: LlamaFleetSpec, *, supported: bool) -> bool:
    """Resolve `prefixSharing.cachePrefix`: `auto` needs a supporting image and the RAM cache left on."""
    mode = spec.prefix_sharing.cache_prefix
    if mode == "on":
        return True
    return mode == "auto" and supported and spec.cache_ram_mib != 0


# Checkpoints a snapshot file carries (`--slot-save-checkpoints`): the gateway's restores extend the
# snapshot, so the latest checkpoint, a few tokens before its end, is what they resume from; the one
# before it (an ubatch earlier) serves a prompt that parts just before the end. Each is the size of the
# window's cells (Gemma 3 270M: 7.5 MiB beside a 17 MiB file at 3K tokens), so a few, not all.
SNAPSHOT_CHECKPOINTS = 2


def snapshot_checkpoints_enabled(spec: LlamaFleetSpec, *, supported: bool) -> bool:
    """Resolve `prefixSharing.snapshotCheckpoints`: `auto` needs a supporting image."""
    mode = spec.prefix_sharing.snapshot_checkpoints
    return mode == "on" or (mode == "auto" and supported)


def detects_features(spec: LlamaFleetSpec) -> bool:
    """Whether the image's features could change the rendering, i.e. whether to detect them at all.

    Only an `auto` flag whose other conditions hold depends on the image; pods of any other spec get no
    detector, so they start exactly as before and images without a shell run unchanged."""
    # `snapshotCheckpoints: auto` rides on the detection these start: alone it would put a detector into
    # every fleet that turned the others on or off by hand, for a flag only some models need.
    return (cache_prefix_enabled(spec, supported=True) and spec.prefix_sharing.cache_prefix == "auto") or (
        attach_enabled(spec, supported=True) and spec.prefix_sharing.attach == "auto")


def snapshot_budget_bytes(spec: LlamaFleetSpec) -> int:
    """The agent's byte budget: explicit, or a share of the snapshot volume's size limit."""
    snaps = spec.snapshots
    if snaps.budget_bytes is not None:
        return snaps.budget_bytes
    return int(quantity_bytes(snaps.size_limit) * DEFAULT_BUDGET_SHARE)


def kv_settings(spec: LlamaFleetSpec) -> dict[str, str | int | bool]:
    """The fleet's KV-layout settings, as the agent's snapshot fingerprint compares them."""
    return {
        "cache_type_k": spec.cache_type_k,
        "cache_type_v": spec.cache_type_v,
        "flash_attn": spec.flash_attention,
        "kv_unified": bool(spec.kv_unified),
        "n_slots": spec.slots,
        "swa_full": False,
    }


def llama_server_args(
    spec: LlamaFleetSpec,
    *,
    model_path: str,
    port: int,
    slot_save_path: str,
    api_key_file: str | None = None,
    host: str = "0.0.0.0",
    attach: bool = False,
    cache_prefix: bool = False,
    snapshot_checkpoints: bool = False,
) -> list[str]:
    """llama-server's argv (without the program), from the spec; `attach` from `attach_enabled()`,
    `cache_prefix` from `cache_prefix_enabled()`, `snapshot_checkpoints` from
    `snapshot_checkpoints_enabled()`."""
    args = [
        "-m", model_path,
        "-a", spec.model.name,
        "--host", host,
        "--port", str(port),
        "-np", str(spec.slots),
        "-c", str(spec.n_ctx),
    ]
    if spec.kv_unified:
        # In a unified pool one slot could grow over the whole pool: cap it at what sessions were sized for.
        args += ["-kvu", "--kv-unified-per-slot", str(spec.context_per_slot)]
    else:
        args += ["-no-kvu"]
    # Idle slots stay as they are. With the default --cache-idle-slots every task launch first copies each
    # idle slot that changed into the RAM cache (a unified pool also clears them, so a pinned request would
    # recompute everything: measured.md): the gateway pins each turn to its session's slot, so the copies
    # buy nothing it uses, and a slot about to lose its content is still saved to RAM. SmolLM2 at 7K tokens
    # a slot: 85 ms of every turn against 4 ms (bench/results/idle_slots.json).
    args += ["--no-cache-idle-slots"]
    args += [
        "-ctk", spec.cache_type_k,
        "-ctv", spec.cache_type_v,
        "-fa", spec.flash_attention,
        "--fit", "off",
    ]
    if spec.gpu is not None and spec.gpu.count > 0:
        args += ["-ngl", "all"]
    args += ["--slot-save-path", slot_save_path, "--metrics", "--jinja"]
    if spec.cache_ram_mib is not None:
        args += ["--cache-ram", str(spec.cache_ram_mib)]
    if spec.ctx_checkpoints is not None:
        args += ["--ctx-checkpoints", str(spec.ctx_checkpoints)]
    if spec.threads is not None:
        args += ["-t", str(spec.threads)]
    if api_key_file is not None:
        args += ["--api-key-file", api_key_file]
    if attach:
        args += ["--slot-attach"]
    if cache_prefix:
        args += ["--cache-prefix"]
    if snapshot_checkpoints:
        args += ["--slot-save-checkpoints", str(SNAPSHOT_CHECKPOINTS)]
    return args + list(spec.extra_args)


def agent_args(
    spec: LlamaFleetSpec,
    *,
    port: int,
    server_url: str,
    snapshot_dir: str,
    model_path: str,
    host: str = "0.0.0.0",
    fleet: str | None = None,
    token_file: str | None = None,
    attach: bool = False,
    server_help_file: str | None = None,
    llama_api_key_file: str | None = None,
    peer_networks: Sequence[str] | None = None,
    signing_key_file: str | None = None,
) -> list[str]:
    """`llamafleet agent`'s argv (after the subcommand).

    The agent writes the KV settings into every snapshot manifest and refuses snapshots whose settings
    differ, so it must be told exactly what llama-server was started with: the same spec, the same values.
    """
    flash: Literal["on", "off"] = spec.flash_attention
    args = [
        "--host", host,
        "--port", str(port),
        "--server-url", server_url,
        "--snapshot-dir", snapshot_dir,
        "--model-path", model_path,
        "--model-name", spec.model.name,
        "--slots", str(spec.slots),
        "--cache-type-k", spec.cache_type_k,
        "--cache-type-v", spec.cache_type_v,
        "--flash-attn", flash,
        "--kv-unified" if spec.kv_unified else "--no-kv-unified",
        "--budget-bytes", str(snapshot_budget_bytes(spec)),
        # Not ready (not routable) until told which SharedPrefix snapshots it must hold, and holds them.
        "--await-required",
    ]
    if spec.model.sha256 is not None:
        args += ["--model-sha256", spec.model.sha256]
    if fleet is not None:
        args += ["--fleet", fleet]
    if token_file is not None:
        args += ["--token-file", token_file]
    if attach:
        args += ["--attach"]
    if server_help_file is not None:
        args += ["--server-help-file", server_help_file]
    if llama_api_key_file is not None:  # the server's --api-key-file: the agent calls it with the key
        args += ["--llama-api-key-file", llama_api_key_file]
    if peer_networks:  # where pulls may go; unset: the agent's default (private networks)
        args += ["--peer-networks", ",".join(peer_networks)]
    if signing_key_file is not None:  # unset: the manifest key is derived from the agent token
        args += ["--signing-key-file", signing_key_file]
    return args

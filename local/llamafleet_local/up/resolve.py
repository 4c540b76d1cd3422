"""Turn FLEET.yaml's `local:` settings into files: the model, the chat template, the llama-server binary,
and what that binary accepts (its `--help`, parsed: the cluster's detector, run directly).

Blocking (a first run builds llama-server, minutes, and writes a tiny model, seconds): the runtime calls
it in a worker thread. Nothing here starts a process that outlives the call.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from llamafleet_core import podspec
from llamafleet_core.crd.fleet import LlamaFleetSpec
from llamafleet_core.devices import min_batch_tokens, parse_devices
from llamafleet_core.features import ServerFeatures, parse_help, summary
from llamafleet_core.gguf_meta import GGUFError, model_sliding_window, read_metadata
from llamafleet_local.provision import ensure_named_model, named_chat_template, named_models, server_binary
from llamafleet_local.up.config import FleetConfig


@dataclass(frozen=True)
class Resolved:
    binary: Path
    model: Path
    chat_template: Path | None
    spec: LlamaFleetSpec  # the effective spec the pods run (local threads and template folded in)
    features: ServerFeatures | None = None  # None: unknown, so `auto` flags stay off
    min_batch_tokens: int | None = None  # the gateway's prefill cliff for this build (devices.py)


def _output(binary: Path, flag: str, timeout: float) -> str | None:
    """What `<binary> <flag>` prints (stdout, then stderr); None when it cannot run. The process is
    bounded by `timeout` and never outlives the call."""
    try:
        done = subprocess.run([str(binary), flag], capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + "\n" + done.stderr


def server_features(binary: Path, timeout: float = 30.0) -> ServerFeatures | None:
    """`<binary> --help`, parsed; None when it cannot run or its output is not llama-server's help."""
    text = _output(binary, "--help", timeout)
    return None if text is None else parse_help(text)


def server_min_batch_tokens(binary: Path, flash_attention: str = "on", timeout: float = 30.0) -> int | None:
    """`<binary> --list-devices`, as the gateway's `min_batch_tokens` for pods running
    `flash_attention`: the CPU cliff when the build sees no GPU and flash attention is on, 0 otherwise,
    None when it cannot tell (the pipeline's own value then stands)."""
    text = _output(binary, "--list-devices", timeout)
    return None if text is None else min_batch_tokens(parse_devices(text), flash_attention)


def carries_chat_template(model: Path) -> bool | None:
    """Whether the GGUF holds a chat template (`tokenizer.chat_template`); None when it cannot be read."""
    try:
        return "tokenizer.chat_template" in read_metadata(model)
    except (OSError, GGUFError):
        return None


def resolve(config: FleetConfig, say: Callable[[str], None]) -> Resolved:
    local = config.local
    # A model's name wins over a file of that name: written (tiny) or fetched (real) on demand, cached.
    if local.model in named_models():
        model = ensure_named_model(local.model)
    else:
        model = config.resolve(local.model).resolve()
    template = config.resolve(local.chat_template).resolve() if local.chat_template else None
    if template is None and local.model in named_models() and (template := named_chat_template(local.model)):
        say(f"chat template {template.name}: {local.model}'s GGUF carries none (set local.chatTemplate to "
            "use another)")
    if local.llama_server is not None:
        binary = config.resolve(local.llama_server).resolve()
    else:
        say("llama-server: building or reusing the project's build (the first build takes minutes)")
        binary = server_binary()
    say(f"model {model.name}, llama-server {binary}")
    spec = config.effective_spec(template)
    own_template = any(arg in ("--chat-template", "--chat-template-file") for arg in spec.extra_args)
    if not own_template and carries_chat_template(model) is False:
        # A base model (gemma3-270m): llama-server would render every chat as ChatML, wrong for most.
        say(f"WARNING: {model.name} carries no chat template: llama-server falls back to ChatML; "
            "set local.chatTemplate to the model's own")
    features = server_features(binary) if podspec.detects_features(spec) else None
    if podspec.detects_features(spec):
        say(f"llama-server prefix-sharing flags: {summary(features)}")
    if features is not None and features.slot_attach and model_sliding_window(model):
        # llama-server turns --slot-attach off on such a model (a window drops cells another slot may
        # still read), and a unified pool for slots that never attach only makes every token attend over
        # every slot's cells (Gemma 3 on patched pods: the 3rd concurrent session 0.68x plain).
        say(f"slot attach off: {model.name} has a sliding window; its pods keep per-slot KV streams")
        features = replace(features, slot_attach=False)
    spec = podspec.for_image(spec, attach_supported=features is not None and features.slot_attach)
    min_batch = server_min_batch_tokens(binary, spec.flash_attention)
    if min_batch:
        say(f"llama-server has no GPU device: the gateway weighs prefills under {min_batch} tokens as slow")
    return Resolved(binary, model, template, spec, features, min_batch)

"""Turn FLEET.yaml's `local:` settings into files: the model, the chat template, the llama-server binary.

Blocking (a first run builds llama-server, minutes, and writes a tiny model, seconds): the runtime calls
it in a worker thread. Nothing here starts a process that outlives the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llamafleet_core.crd.fleet import LlamaFleetSpec
from llamafleet_local.tinymodels import MODEL_NAMES, ensure_model
from llamafleet_local.up.config import FleetConfig


@dataclass(frozen=True)
class Resolved:
    binary: Path
    model: Path
    chat_template: Path | None
    spec: LlamaFleetSpec  # the effective spec the pods run (local threads and template folded in)


def resolve(config: FleetConfig, say: Callable[[str], None]) -> Resolved:
    local = config.local
    # A tiny model's name wins over a file of that name: it is written on demand, and cached.
    model = ensure_model(local.model) if local.model in MODEL_NAMES else config.resolve(local.model).resolve()
    template = config.resolve(local.chat_template).resolve() if local.chat_template else None
    if local.llama_server is not None:
        binary = config.resolve(local.llama_server).resolve()
    else:
        from llamafleet_local.llama_build import build

        say("llama-server: building or reusing the project's build (the first build takes minutes)")
        binary = build()
    say(f"model {model.name}, llama-server {binary}")
    return Resolved(binary, model, template, config.effective_spec(template))

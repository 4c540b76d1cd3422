"""What `llamafleet up` may ask of the test bed: a model known by name, or a build of llama-server.

The test bed (llamafleet_testbed) is a distribution of its own, absent from the pod image. It is imported
here on use only, so the runtime runs without it whenever FLEET.yaml names its own files (`local.model`,
`local.llamaServer`) or `LLAMAFLEET_LLAMA_SERVER` names the binary; a name or a build it cannot serve
fails with a message that says so, not a traceback.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

TESTBED = "llamafleet_testbed"
ENV_BINARY = "LLAMAFLEET_LLAMA_SERVER"


class ProvisionError(RuntimeError):
    """What FLEET.yaml asks for cannot be had here; the message says what to set or install instead."""


class TestbedMissing(ProvisionError):
    """The test bed is not installed."""


def _testbed(module: str, wanted: str) -> ModuleType:
    try:
        return importlib.import_module(f"{TESTBED}.{module}")
    except ModuleNotFoundError as exc:
        # Only the test bed's own absence: a dependency missing inside it is its own error.
        if exc.name is None or exc.name.split(".")[0] != TESTBED:
            raise
        raise TestbedMissing(f"{wanted} needs the test bed ({TESTBED}, the llamafleet-testbed "
                             "distribution), which is not installed") from None


def named_models() -> tuple[str, ...]:
    """The models `local.model` may name (tiny ones written, real ones fetched); none without the bed."""
    try:
        names: tuple[str, ...] = _testbed("named_models", "a named model").NAMED_MODELS
    except TestbedMissing:
        return ()
    return names


def ensure_named_model(name: str) -> Path:
    """The GGUF of the model named `name`, written or fetched by the test bed when absent."""
    path: Path = _testbed("named_models", f"the named model {name!r}").ensure_named_model(name)
    return path


def named_chat_template(name: str) -> Path | None:
    """The chat template the test bed runs the named model with when its GGUF carries none."""
    path: Path | None = _testbed("named_models", f"the named model {name!r}").named_chat_template(name)
    return path


def own_binary(env_name: str = ENV_BINARY) -> Path | None:
    """The llama-server binary `$env_name` names, None when unset; ProvisionError when it names no
    executable file."""
    own = os.environ.get(env_name)
    if not own:
        return None
    path = Path(own)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ProvisionError(f"{env_name}={own} is not an executable file")
    return path


def server_binary() -> Path:
    """`$LLAMAFLEET_LLAMA_SERVER`, else the project's build from the test bed (built when absent)."""
    own = own_binary()
    if own is not None:
        return own
    wanted = f"building llama-server (set local.llamaServer or {ENV_BINARY} to a binary instead)"
    path: Path = _testbed("llama_build", wanted).build()
    return path

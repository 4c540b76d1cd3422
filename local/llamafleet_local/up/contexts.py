"""The context each slot really has, read back from every pod, and what `up` says about it.

Why: llama-server silently gives a slot less than `contextPerSlot` when the model is trained on fewer
tokens (`the slot context (24576) exceeds the training context of the model (8192) - capping`, a warning
in its log only) or when a unified KV pool is smaller. A fleet that went healthy on that promise then
fails first sight of a long head into a silent cold compute. So `up` reads each pod's `/props` (the
per-slot `n_ctx` its slots run with), reports it, and warms SharedPrefixes against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from llamafleet_core.gguf_meta import GGUFError, read_metadata
from llamafleet_core.llama_client import LlamaClient, LlamaError


def slot_context(props: Mapping[str, Any]) -> int | None:
    """The per-slot context in a llama-server `/props` answer (pure); None when it has none."""
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


def trained_context(model: Path) -> int | None:
    """`<arch>.context_length` of the GGUF file: the context the model was trained on; None if unknown."""
    try:
        meta = read_metadata(model)
    except (OSError, GGUFError):
        return None
    value = meta.get(f"{meta.get('general.architecture')}.context_length")
    return value if isinstance(value, int) and value > 0 else None


async def read_slot_context(url: str, http: httpx.AsyncClient, api_key: str | None = None) -> int | None:
    """The per-slot context pod `url` runs with (its `/props`); None when it does not say."""
    try:
        return slot_context(await LlamaClient(url, http, api_key).props())
    except LlamaError:
        return None


def context_note(pod: str, asked: int, got: int | None, trained: int | None) -> str:
    """The progress line for one pod's slot context (pure)."""
    if got is None:
        return f"{pod}: llama-server did not report its slot context (/props); {asked} tokens assumed"
    if got >= asked:
        return f"{pod}: {got} tokens per slot"
    why = (f"the model is trained on {trained} tokens and llama-server caps slots there"
           if trained is not None and got == trained else "llama-server gave each slot less")
    return f"{pod}: WARNING {got} tokens per slot, not the {asked} of contextPerSlot ({why})"


def fitting_context(contexts: Mapping[str, int | None], asked: int) -> int:
    """The context every pod's slots hold: the smallest reported one, `asked` where a pod did not say."""
    return min((c if c is not None else asked for c in contexts.values()), default=asked)


def capped_note(contexts: Mapping[str, int | None], asked: int) -> str:
    """Why a SharedPrefix that does not fit is refused, when the cause is a capped slot (pure)."""
    capped = {pod: c for pod, c in contexts.items() if c is not None and c < asked}
    if not capped:
        return ""
    pods = ", ".join(f"{pod} {c}" for pod, c in sorted(capped.items()))
    return (f"llama-server caps the slots below contextPerSlot ({asked}): {pods} tokens per slot; "
            "raising contextPerSlot does not help past the model's training context")

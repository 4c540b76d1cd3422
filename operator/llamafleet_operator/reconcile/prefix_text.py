"""The text a SharedPrefix warms: inline in the spec, or read from a ConfigMap (`spec.textFrom`).

A large prefix lives in a ConfigMap because client-side `kubectl apply` copies the whole spec into an
annotation, and annotations hold 256 KiB at most. The ConfigMap is read on every reconcile, the timer's
too, so an edited ConfigMap is warmed again within one prefix interval with no watch on ConfigMaps; the
text's digest joins the generation in the revision that warm results and retries are kept by.
"""

from __future__ import annotations

import dataclasses
import hashlib

from llamafleet_core.crd.models import SharedPrefixSpec
from llamafleet_core.warming import PrefixSource
from llamafleet_operator.reconcile.context import Context

Revision = int | str | None
"""What a warm result holds for: the generation, plus the text's digest when the text is referenced."""


class TextNotFound(Exception):
    """The referenced ConfigMap or key does not exist (yet): the prefix waits, the timer looks again."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


async def referenced_text(ctx: Context, namespace: str, spec: SharedPrefixSpec) -> str | None:
    """The text `spec.textFrom` names, or None without one. `TextNotFound` when it is missing."""
    if spec.text_from is None:
        return None
    ref = spec.text_from.config_map_key_ref
    where = f"spec.textFrom.configMapKeyRef: ConfigMap {ref.name!r} in {namespace}"
    config_map = await ctx.kube.get("v1", "ConfigMap", namespace, ref.name)
    if config_map is None:
        raise TextNotFound(f"{where} not found", "ConfigMapNotFound")
    data = config_map.get("data") or {}
    text = data.get(ref.key)
    if not isinstance(text, str) or not text:
        keys = ", ".join(sorted(data)) or "none"
        raise TextNotFound(f"{where} has no key {ref.key!r} with text (keys: {keys})", "ConfigMapKeyNotFound")
    return text


def prefix_source(name: str, spec: SharedPrefixSpec, model: str, text: str | None) -> PrefixSource:
    """What warming takes: the spec's own content, or the referenced `text` in place of `spec.text`."""
    source = PrefixSource.from_spec(name, spec, model)
    return source if text is None else dataclasses.replace(source, text=text)


def revision(generation: int | None, text: str | None) -> Revision:
    """The generation alone for inline content; with referenced text, its digest too (pure)."""
    if text is None:
        return generation
    return f"{generation}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

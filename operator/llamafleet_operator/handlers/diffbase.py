"""kopf's diff base (the last handled spec) in an annotation, with a SharedPrefix's content as digests.

kopf keeps a copy of the spec it last handled to tell a change from a resync; in an annotation by default,
and annotations hold 256 KiB at most, all of them together. A 32K-token prefix is about 130 KB of text:
with kubectl's own copy (`last-applied-configuration`) the two exceed the limit, and the API server
refuses the write. A digest changes whenever the content does, so kopf still sees every change and the
update handlers still run; the handlers read the spec from the object, never from the diff.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import kopf

# The content fields of a SharedPrefix spec, each as large as a prompt; LlamaFleet has none of them.
DIGESTED = ("text", "messages", "tools", "templateKwargs")


def digest(value: Any) -> str:
    """A short, stable stand-in for a JSON value (pure)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class DigestedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """`AnnotationsDiffBaseStorage` whose essence has `spec.<field>` replaced by its digest."""

    def __init__(self, *, digested: Iterable[str] = DIGESTED, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.digested = tuple(digested)

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        spec = essence.get("spec")
        if isinstance(spec, dict):
            for name in self.digested:
                if name in spec:
                    spec[name] = digest(spec[name])
        return essence

"""Cross-field rules of the CRDs as CEL (`x-kubernetes-validations`), so `kubectl apply` rejects a bad spec.

The pydantic validators check the same rules with the same messages: the operator keeps them for API
servers without CEL and for objects admitted before a rule existed. Each rule treats an absent field as
its default (the API server applies schema defaults before it evaluates CEL, but a rule must not fail
on an object that skipped defaulting), and none iterates a list, so no rule needs `maxItems` to pass the
API server's cost estimate. Messages name the field themselves: `fieldPath` needs Kubernetes 1.28 and
the charts support 1.27.
"""

from __future__ import annotations

from typing import cast

from pydantic.config import JsonDict, JsonValue

# The V cache types that need no flash attention; kept beside `fleet.UNQUANTIZED`, which a test compares.
_UNQUANTIZED_CEL = "['bf16', 'f16', 'f32']"

QUANTIZED_V_NEEDS_FA = "cacheTypeV: a quantized V cache needs flashAttention: on"
ATTACH_NEEDS_UNIFIED = "prefixSharing.attach: on needs kvUnified: true or unset (slots share one KV pool)"
CACHE_PREFIX_NEEDS_RAM = "prefixSharing.cachePrefix: on needs the RAM prompt cache (cacheRamMiB not 0)"
CONTEXT_TOTAL_NEEDS_UNIFIED = "contextTotal: only meaningful with a unified KV pool (kvUnified not false)"
HEAD_BELOW_SLOT_CONTEXT = "prefixSharing.headTokens: must be less than contextPerSlot"
PVC_NEEDS_NAME = ("snapshots.pvcName: required for storage pvc with a Deployment "
                  "(or use workload: StatefulSet for a claim per pod)")

# kvUnified unset is `auto`: unified wherever slots attach (podspec.unified_kv)
_UNIFIED = "(!has(self.kvUnified) || self.kvUnified)"

FLEET_SPEC_RULES: list[dict[str, str]] = [
    {"rule": f"!has(self.cacheTypeV) || self.cacheTypeV in {_UNQUANTIZED_CEL} "
             "|| !has(self.flashAttention) || self.flashAttention == 'on'",
     "message": QUANTIZED_V_NEEDS_FA},
    {"rule": "!has(self.prefixSharing) || !has(self.prefixSharing.attach) "
             f"|| self.prefixSharing.attach != 'on' || {_UNIFIED}",
     "message": ATTACH_NEEDS_UNIFIED},
    {"rule": "!has(self.prefixSharing) || !has(self.prefixSharing.cachePrefix) "
             "|| self.prefixSharing.cachePrefix != 'on' || !has(self.cacheRamMiB) || self.cacheRamMiB != 0",
     "message": CACHE_PREFIX_NEEDS_RAM},
    {"rule": f"!has(self.contextTotal) || {_UNIFIED}",
     "message": CONTEXT_TOTAL_NEEDS_UNIFIED},
    {"rule": "!has(self.prefixSharing) || !has(self.prefixSharing.headTokens) "
             "|| self.prefixSharing.headTokens < (has(self.contextPerSlot) ? self.contextPerSlot : 32768)",
     "message": HEAD_BELOW_SLOT_CONTEXT},
    {"rule": "!has(self.snapshots) || !has(self.snapshots.storage) || self.snapshots.storage != 'pvc' "
             "|| (has(self.workload) && self.workload == 'StatefulSet') || has(self.snapshots.pvcName)",
     "message": PVC_NEEDS_NAME},
]

TEXT_OR_TEXT_FROM = "text: set text or textFrom, not both"
TEXT_EXCLUSIVE = "text: exclusive with messages and tools, as is textFrom; set one or the other"
PREFIX_EMPTY = "messages: set messages, tools or text (or textFrom)"

_RAW = "(has(self.text) || has(self.textFrom))"
_TEMPLATED = "((has(self.messages) && size(self.messages) > 0) || (has(self.tools) && size(self.tools) > 0))"

PREFIX_SPEC_RULES: list[dict[str, str]] = [
    {"rule": "!(has(self.text) && has(self.textFrom))", "message": TEXT_OR_TEXT_FROM},
    {"rule": f"!{_RAW} || !{_TEMPLATED}", "message": TEXT_EXCLUSIVE},
    {"rule": f"{_RAW} || {_TEMPLATED}", "message": PREFIX_EMPTY},
]


def validations(rules: list[dict[str, str]]) -> JsonDict:
    """A model's `json_schema_extra` that puts `rules` on its schema node."""
    return {"x-kubernetes-validations": cast("list[JsonValue]", rules)}

"""What a LlamaFleet may ask of the cluster (pure): the operator refuses any other spec.

The operator creates pods with its own rights, so without these checks whoever may create a LlamaFleet
gets any pod: a hostPath of `/` on any node, any image beside the agent token, control-plane nodes,
llama-server flags that serve files or load other models. The chart states the same rules as a
ValidatingAdmissionPolicy (templates/admission.yaml) so that `kubectl apply` refuses them up front; the
operator checks them again because a policy can be off, not yet bound, or older than the operator.

- `model.source.hostPath` only under `host_paths` (whole path components, no `.` or `..`); none
  configured: hostPath is refused (use a PVC or an image);
- `image` (and `model.source.image.reference`) and `agentImage` each match one of their regular
  expressions (whole match); an empty list allows any image;
- `extraArgs`: every flag (`--flag`, `--flag=value`; a negative number is a value) is on the allow-list;
- tolerations, node selector and node affinity never name control-plane nodes (nor tolerate every
  taint) unless `control_plane` is allowed;
- `apiKeySecretRef` never names the agent-token Secret (the llama-server container would then hold the
  credential the agent beside it keeps from it), nor does an entry of `podTemplate.env`;
- `podTemplate.env` sets no `LLAMA_*` variable (llama-server reads its flags from `LLAMA_ARG_*`, which
  would bypass the extraArgs allow-list) and no `LD_*` one (a library preloaded from the model volume
  would run code the image allow-list never saw).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamafleet_core.crd.models import LlamaFleetSpec

CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

#: llama-server flags a fleet may add: performance, sampling defaults, context handling. Left out on
#: purpose: whatever reads or serves files (`--path`, `--chat-template-file`, `--lora`, `--mmproj`,
#: `--control-vector`, `--model-draft`, `--ssl-*`), downloads (`-hf`, `--model-url`), reaches other
#: hosts (`--rpc`), changes the served identity or the API (`--alias`, `--api-key*`, `--host`,
#: `--port`, `--props`, `--webui`), or the flags the operator sets itself.
DEFAULT_EXTRA_ARGS: tuple[str, ...] = (
    "--swa-full", "--threads-batch", "-tb", "--threads-http", "--batch-size", "-b", "--ubatch-size", "-ub",
    "--mlock", "--no-mmap", "--numa", "--n-gpu-layers", "-ngl", "--split-mode", "-sm", "--tensor-split",
    "-ts", "--main-gpu", "-mg", "--device", "-dev", "--no-kv-offload", "-nkvo", "--cont-batching", "-cb",
    "--no-cont-batching", "-nocb", "--cache-reuse", "--context-shift", "--no-context-shift",
    "--swa-checkpoints", "--slot-prompt-similarity", "-sps", "--n-predict", "-n", "--temp", "--top-k",
    "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--presence-penalty",
    "--frequency-penalty", "--seed", "-s", "--rope-scaling", "--rope-scale", "--rope-freq-base",
    "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow",
    "--yarn-beta-fast", "--reasoning-format", "--reasoning-budget", "--chat-template", "--no-warmup",
    "--poll", "--prio", "--prio-batch", "--defrag-thold", "-dt", "--log-verbosity", "-lv", "--log-disable",
    "--log-timestamps", "--log-prefix", "--log-colors", "--timeout", "-to", "--override-tensor", "-ot",
    "--cpu-moe", "--n-cpu-moe",
)

#: Environment name prefixes `podTemplate.env` may not use (see the module docstring).
REFUSED_ENV_PREFIXES: tuple[str, ...] = ("LLAMA_", "LD_")
_FLAG = re.compile(r"^-[^0-9.]")  # "-1" or "-.5" is a value, not a flag
_DOT_PARTS = re.compile(r"(^|/)\.\.?(/|$)")


@dataclass(frozen=True)
class AdmissionPolicy:
    host_paths: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    agent_images: tuple[str, ...] = ()
    extra_args: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_EXTRA_ARGS))
    control_plane: bool = False
    agent_token_secret: str | None = None

    def __post_init__(self) -> None:
        for pattern in (*self.images, *self.agent_images):
            try:
                re.compile(pattern)  # a bad pattern fails at start-up, not on the first fleet
            except re.error as exc:
                raise ValueError(f"image pattern {pattern!r} is not a regular expression: {exc}") from None


def _under(path: str, prefixes: Iterable[str]) -> bool:
    if _DOT_PARTS.search(path) or "//" in path:
        return False
    for prefix in prefixes:
        base = prefix.rstrip("/") or "/"
        if path == base or path.startswith(base if base == "/" else base + "/"):
            return True
    return False


def _image_ok(image: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(re.fullmatch(p, image) for p in patterns)


def flag_name(arg: str) -> str | None:
    """The flag an extraArgs entry is (`--flag=value` -> `--flag`), or None for a value."""
    if not _FLAG.match(arg):
        return None
    return arg.split("=", 1)[0]


def _names_control_plane(spec: LlamaFleetSpec) -> list[str]:
    found = []
    for t in spec.tolerations:
        key = t.get("key")
        if key in CONTROL_PLANE_LABELS:
            found.append(f"spec.tolerations: tolerates {key}")
        elif not key and t.get("operator") == "Exists":
            found.append("spec.tolerations: a toleration without a key tolerates every taint, "
                         "control-plane ones too")
    found += [f"spec.nodeSelector: selects {k}" for k in spec.node_selector if k in CONTROL_PLANE_LABELS]
    if _mentions((spec.affinity or {}).get("nodeAffinity"), CONTROL_PLANE_LABELS):
        found.append("spec.affinity.nodeAffinity: names control-plane nodes")
    return found


def _mentions(value: Any, keys: Sequence[str]) -> bool:
    """Whether a `key: <one of keys>` appears anywhere in a nodeAffinity stanza (its match expressions)."""
    if isinstance(value, dict):
        return value.get("key") in keys or any(_mentions(v, keys) for v in value.values())
    if isinstance(value, list):
        return any(_mentions(v, keys) for v in value)
    return False


def violations(spec: LlamaFleetSpec, policy: AdmissionPolicy) -> list[str]:
    """Every rule `spec` breaks, as `field: why` lines; empty when the fleet is admitted."""
    out: list[str] = []
    source = spec.model.source
    if source.host_path is not None and not _under(source.host_path, policy.host_paths):
        allowed = ", ".join(policy.host_paths) or "none"
        out.append(f"spec.model.source.hostPath: {source.host_path} is not under an allowed folder "
                   f"(allowed: {allowed})")
    if not _image_ok(spec.image, policy.images):
        out.append(f"spec.image: {spec.image} matches no allowed image pattern")
    if source.image is not None and not _image_ok(source.image.reference, policy.images):
        out.append(f"spec.model.source.image.reference: {source.image.reference} matches no allowed "
                   "image pattern")
    # Unset, the operator's own agent image: the policy governs what a fleet asks for.
    if spec.agent_image is not None and not _image_ok(spec.agent_image, policy.agent_images):
        out.append(f"spec.agentImage: {spec.agent_image} matches no allowed agent image pattern")
    refused = sorted({f for f in map(flag_name, spec.extra_args) if f and f not in policy.extra_args})
    if refused:
        out.append(f"spec.extraArgs: flags not on the allow-list: {', '.join(refused)}")
    if not policy.control_plane:
        out += _names_control_plane(spec)
    ref = spec.api_key_secret_ref
    if ref is not None and policy.agent_token_secret and ref.name == policy.agent_token_secret:
        out.append(f"spec.apiKeySecretRef: {ref.name} is the agents' token Secret")
    return out + _env_violations(spec, policy)


def _env_violations(spec: LlamaFleetSpec, policy: AdmissionPolicy) -> list[str]:
    out = []
    for var in spec.pod_template.env:
        if var.name.startswith(REFUSED_ENV_PREFIXES):
            out.append(f"spec.podTemplate.env: {var.name} is refused (LLAMA_* sets llama-server flags: use "
                       "extraArgs; LD_* preloads code)")
        if policy.agent_token_secret and var.secret_name() == policy.agent_token_secret:
            out.append(f"spec.podTemplate.env: {var.name} reads the agents' token Secret")
    return out

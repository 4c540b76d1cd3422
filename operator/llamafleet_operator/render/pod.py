"""The pod template: llama-server, the snapshot agent beside it, and the volumes they share.

- `snapshots` is llama-server's `--slot-save-path` and the agent's folder: the agent asks the server to
  save a slot, then manifests, serves and pulls the files in place.
- `models` holds the GGUF: an existing claim or node folder (read-only), or an emptyDir that an init
  container fills (download from a URL, verified against sha256 when given; or copied out of an image).
- Both containers run as non-root with a read-only root file system; `/tmp` is an emptyDir.
- Readiness is the agent's `/ready`: a pod takes traffic only once its agent has pulled and verified the
  fleet's shared prefixes. llama-server gets a startup probe (model loads can take minutes) and a liveness
  probe on `/health`, which is public even with an API key.
"""

from __future__ import annotations

from typing import Any

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import LlamaFleet, LlamaFleetSpec
from llamafleet_operator.render.common import Manifest, Target, digest

UID = 65532  # the conventional "nonroot" uid of distroless images
API_KEY_FILE = f"{podspec.SECRETS_DIR}/api-key/api-key"
AGENT_TOKEN_FILE = f"{podspec.SECRETS_DIR}/agent-token/token"

# Runs in the agent image (which has Python): download to a temporary name, check the digest, then rename,
# so a pod restarted mid-download never serves a truncated file. Arguments: url, destination, sha256 or "".
FETCH_MODEL = """\
import hashlib, os, sys, urllib.request
url, dest, want = sys.argv[1], sys.argv[2], sys.argv[3]
if os.path.exists(dest) and not want:
    sys.exit(0)
os.makedirs(os.path.dirname(dest), exist_ok=True)
h = hashlib.sha256()
with urllib.request.urlopen(url) as r, open(dest + ".part", "wb") as f:
    for chunk in iter(lambda: r.read(1 << 20), b""):
        h.update(chunk)
        f.write(chunk)
if want and h.hexdigest() != want:
    sys.exit(f"sha256 mismatch for {url}: got {h.hexdigest()}, want {want}")
os.replace(dest + ".part", dest)
"""

# Runs in the user's llama-server image (it needs a POSIX shell): `--help` once, written where the agent
# reads it. Always exits 0: detection is best effort, and a failed detector must never keep a pod from
# starting (the agent then reports "unknown" and `auto` flags stay off). Arguments: binary, output file.
DETECT_FEATURES = """\
bin="$1"; out="$2"
[ -x "$bin" ] || bin="$(command -v llama-server 2>/dev/null || true)"
mkdir -p "$(dirname "$out")" || exit 0
if [ -n "$bin" ]; then "$bin" --help > "$out.part" 2>&1
else echo "llama-server not found: $1" > "$out.part"; fi
mv "$out.part" "$out" 2>/dev/null
exit 0
"""


def _env_pod_identity() -> list[Manifest]:
    fields = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid",
              "POD_IP": "status.podIP"}
    return [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in fields.items()]


def _container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _snapshot_mount(spec: LlamaFleetSpec) -> Manifest:
    mount: Manifest = {"name": "snapshots", "mountPath": podspec.SNAPSHOT_DIR}
    if spec.snapshots.storage == "pvc" and spec.snapshots.pvc_name is not None:
        # One shared claim: every pod keeps its own sub-folder, named after the pod.
        mount["subPathExpr"] = "$(POD_NAME)"
    return mount


def volumes(spec: LlamaFleetSpec, target: Target) -> list[Manifest]:
    source = spec.model.source
    if source.pvc is not None:
        models: Manifest = {"persistentVolumeClaim": {"claimName": source.pvc, "readOnly": True}}
    elif source.host_path is not None:
        models = {"hostPath": {"path": source.host_path, "type": "Directory"}}
    else:
        models = {"emptyDir": {}}
    snaps = spec.snapshots
    if snaps.storage == "memory":
        snapshots: Manifest | None = {"emptyDir": {"medium": "Memory", "sizeLimit": str(snaps.size_limit)}}
    elif snaps.storage == "disk":
        snapshots = {"emptyDir": {"sizeLimit": str(snaps.size_limit)}}
    elif snaps.pvc_name is not None:
        snapshots = {"persistentVolumeClaim": {"claimName": snaps.pvc_name}}
    else:
        snapshots = None  # a StatefulSet volumeClaimTemplate provides it
    vols = [{"name": "models", **models}]
    if snapshots is not None:
        vols.append({"name": "snapshots", **snapshots})
    vols += [
        {"name": "tmp", "emptyDir": {}},
        {"name": "config", "configMap": {"name": target.config_map}},
    ]
    if spec.api_key_secret_ref is not None:
        ref = spec.api_key_secret_ref
        vols.append({"name": "api-key", "secret": {
            "secretName": ref.name, "items": [{"key": ref.key, "path": "api-key"}], "defaultMode": 0o440}})
    if target.agent_token_secret is not None:
        vols.append({"name": "agent-token", "secret": {
            "secretName": target.agent_token_secret, "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o440}})
    return vols


def detect_container(spec: LlamaFleetSpec) -> Manifest:
    """`llama-server --help` from the fleet's own image, for the agent to report (see DETECT_FEATURES)."""
    return {
        "name": "detect-features", "image": spec.image, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", DETECT_FEATURES, "detect-features", spec.prefix_sharing.server_binary,
                    podspec.SERVER_HELP_FILE],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _container_security(),
    }


def init_containers(spec: LlamaFleetSpec, target: Target) -> list[Manifest]:
    source = spec.model.source
    dest = podspec.model_path(spec)
    common: Manifest = {
        "volumeMounts": [
            {"name": "models", "mountPath": podspec.MODEL_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": _container_security(),
    }
    out: list[Manifest] = []
    if source.url is not None:
        out.append({"name": "fetch-model", "image": target.agent_image_of(spec),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", FETCH_MODEL, source.url, dest, spec.model.sha256 or ""],
                    **common})
    elif source.image is not None:
        src = f"{source.image.path.rstrip('/')}/{spec.model.file}"
        out.append({"name": "copy-model", "image": source.image.reference, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", 'mkdir -p "$(dirname "$2")" && cp "$1" "$2"', "copy-model",
                                src, dest],
                    **common})
    if podspec.detects_features(spec):
        out.append(detect_container(spec))  # last: a failed model fetch should be the first thing shown
    return out


def _server_resources(spec: LlamaFleetSpec) -> Manifest:
    res: dict[str, Any] = {k: dict(v) for k, v in (spec.resources or {}).items()}
    if spec.gpu is not None and spec.gpu.count > 0:
        # Extended resources must be set as limits (requests default to them).
        res.setdefault("limits", {})[spec.gpu.resource_name] = spec.gpu.count
    return res


def server_container(spec: LlamaFleetSpec, target: Target) -> Manifest:
    args = podspec.llama_server_args(
        spec,
        model_path=podspec.model_path(spec),
        port=podspec.SERVER_PORT,
        slot_save_path=podspec.SNAPSHOT_DIR,
        api_key_file=API_KEY_FILE if spec.api_key_secret_ref is not None else None,
        attach=target.attach(spec),
        cache_prefix=target.cache_prefix(spec),
        snapshot_checkpoints=target.snapshot_checkpoints(spec),
    )
    mounts = [
        {"name": "models", "mountPath": podspec.MODEL_DIR, "readOnly": True},
        _snapshot_mount(spec),
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if spec.api_key_secret_ref is not None:
        mounts.append({"name": "api-key", "mountPath": f"{podspec.SECRETS_DIR}/api-key", "readOnly": True})
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "name": "llama-server",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": _env_pod_identity() + [v.to_k8s() for v in spec.pod_template.env],
        "ports": [{"name": "http", "containerPort": podspec.SERVER_PORT, "protocol": "TCP"}],
        "startupProbe": {**health, "periodSeconds": 5, "failureThreshold": 180, "timeoutSeconds": 3},
        "livenessProbe": {**health, "periodSeconds": 20, "failureThreshold": 6, "timeoutSeconds": 5},
        "resources": _server_resources(spec),
        "volumeMounts": mounts,
        "securityContext": _container_security(),
    }


def agent_container(spec: LlamaFleetSpec, target: Target) -> Manifest:
    args = podspec.agent_args(
        spec,
        port=podspec.AGENT_PORT,
        server_url=f"http://127.0.0.1:{podspec.SERVER_PORT}",
        snapshot_dir=podspec.SNAPSHOT_DIR,
        model_path=podspec.model_path(spec),
        fleet=target.name,
        token_file=AGENT_TOKEN_FILE if target.agent_token_secret is not None else None,
        attach=target.attach(spec),
        server_help_file=podspec.SERVER_HELP_FILE if podspec.detects_features(spec) else None,
        # The agent calls llama-server's /props and /slots: with the server's key, or every call is a 401.
        llama_api_key_file=API_KEY_FILE if spec.api_key_secret_ref is not None else None,
        peer_networks=target.agent_peer_networks or None,
    )
    mounts = [
        _snapshot_mount(spec),
        {"name": "models", "mountPath": podspec.MODEL_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "config", "mountPath": "/etc/llamafleet", "readOnly": True},
    ]
    # The agent token (from which the agent also derives its manifest-signing key) is mounted here only,
    # never into llama-server's container: that one writes the snapshot folder and must not be able to
    # sign a manifest (`llamafleet_core.snapshot_signing`).
    if target.agent_token_secret is not None:
        mounts.append(
            {"name": "agent-token", "mountPath": f"{podspec.SECRETS_DIR}/agent-token", "readOnly": True})
    if spec.api_key_secret_ref is not None:
        mounts.append({"name": "api-key", "mountPath": f"{podspec.SECRETS_DIR}/api-key", "readOnly": True})
    return {
        "name": "agent",
        "image": target.agent_image_of(spec),
        "imagePullPolicy": "IfNotPresent",
        "command": ["llamafleet", "agent"],
        "args": args,
        "env": _env_pod_identity(),
        "ports": [{"name": "agent", "containerPort": podspec.AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "agent"}, "periodSeconds": 5,
                           "failureThreshold": 3, "timeoutSeconds": 3},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
        "volumeMounts": mounts,
        "securityContext": _container_security(),
    }


def _scheduling(spec: LlamaFleetSpec) -> Manifest:
    node_selector = dict(spec.node_selector)
    tolerations = [dict(t) for t in spec.tolerations]
    if spec.gpu is not None and spec.gpu.count > 0:
        if spec.gpu.product:
            node_selector.setdefault("nvidia.com/gpu.product", spec.gpu.product)
        # GPU nodes are commonly tainted with the GPU resource name; tolerate it unless the user did.
        if not any(t.get("key") == spec.gpu.resource_name for t in tolerations):
            tolerations.append({"key": spec.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"})
    extra = spec.pod_template
    out: Manifest = {}
    if extra.runtime_class_name:
        out["runtimeClassName"] = extra.runtime_class_name
    if extra.priority_class_name:
        out["priorityClassName"] = extra.priority_class_name
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    if spec.affinity:
        out["affinity"] = spec.affinity
    return out


def pod_template(fleet: LlamaFleet, target: Target) -> Manifest:
    """The pod template of the workload; its spec-hash annotation changes whenever the pod spec does."""
    spec = target.spec_of(fleet)
    pod_spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **_scheduling(spec),
        "initContainers": init_containers(spec, target),
        "containers": [server_container(spec, target), agent_container(spec, target)],
        "volumes": volumes(spec, target),
    }
    if spec.pod_template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [r.to_k8s() for r in spec.pod_template.image_pull_secrets]
    if not pod_spec["initContainers"]:
        del pod_spec["initContainers"]
    annotations = {L.SPEC_HASH: digest(pod_spec), L.SLOTS: str(spec.slots),
                   L.ATTACH: "true" if target.attach(spec) else "false"}
    if spec.model.sha256:
        annotations[L.MODEL_SHA256] = spec.model.sha256
    # The fleet's own keys first: the model refuses reserved ones, and the operator's win regardless.
    meta = {"labels": {**spec.pod_template.labels, **L.common_labels(target.name)},
            "annotations": {**spec.pod_template.annotations, **annotations}}
    return {"metadata": meta, "spec": pod_spec}

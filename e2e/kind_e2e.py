"""End to end on a real Kubernetes: kind, the chart, a CPU fleet with a tiny model, a SharedPrefix, and agent
sessions through the gateway that must reuse the shared prefix.

    python -m e2e.kind_e2e            # from the repository root; exit 0 on success, 3 when skipped
    LLAMAFLEET_E2E_KEEP=1 ...         # leave the kind cluster running afterwards (to inspect it)

Needs a Docker engine and `kind`; helm and kubectl come from `llamafleet_testbed.helm` (cached). Where
Docker or kind is missing it prints one line saying so and exits 3 (the pytest module skips).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("LLAMAFLEET_E2E_CLUSTER", "llamafleet-e2e")
NAMESPACE = "llamafleet"
RELEASE = "llamafleet"
CHART = ROOT / "charts" / "llamafleet"
CRD_CHART = ROOT / "charts" / "llamafleet-crds"
GATEWAY_SERVICE = f"{RELEASE}-gateway"  # the chart's <fullname>-gateway; fullname is the release name here
TAG = "e2e"
IMAGE = f"llamafleet/llamafleet:{TAG}"
SERVER_IMAGE = f"llamafleet/llama-server:{TAG}"
MODEL_IMAGE = f"llamafleet/tiny-model:{TAG}"
MODEL = "tiny-dense"
API_KEY = "sk-test-not-secret"  # the CPU example values' key
SESSIONS = 4
PREFIX_CHARS = 12_000  # about 3K tokens: long enough that reuse is unmistakable, quick to prefill on CPU
SKIPPED = 3


class Skip(Exception):
    """Docker or kind is not there: not a failure, one clear line."""


def log(message: str) -> None:
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


def missing_prerequisite() -> str | None:
    """Why this machine cannot run the test, or None. A docker client without an engine counts as absent:
    `docker info` must reach a server."""
    docker = shutil.which("docker")
    if docker is None:
        return "docker is not installed"
    try:
        info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 20 s"
    if info.returncode != 0 or not info.stdout.strip():
        reason = (info.stderr.strip().splitlines() or ["no answer"])[0]
        return f"no Docker engine answers ({reason})"
    if shutil.which(os.environ.get("KIND", "kind")) is None:
        return "kind is not installed (set KIND to its path)"
    return None


def run(*cmd: str | Path, timeout: float = 900, stdin: str | None = None, check: bool = True) -> str:
    args = [str(c) for c in cmd]
    log("$ " + " ".join(args)[:200])
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and result.returncode != 0:
        tail = f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        raise RuntimeError(f"{args[0]} failed ({result.returncode}):\n{tail}")
    return result.stdout


def build_images(model_file: Path) -> None:
    run("docker", "build", "-t", IMAGE, ROOT, timeout=1800)
    run("docker", "build", "-f", ROOT / "docker" / "llama-server-cpu.Dockerfile", "-t", SERVER_IMAGE, ROOT,
        timeout=3600)
    with tempfile.TemporaryDirectory() as ctx:
        shutil.copy(model_file, Path(ctx) / f"{MODEL}.gguf")
        run("docker", "build", "-f", ROOT / "docker" / "tiny-model.Dockerfile", "-t", MODEL_IMAGE, ctx)


def create_cluster(kind: str) -> None:
    clusters = run(kind, "get", "clusters").split()
    if CLUSTER not in clusters:
        run(kind, "create", "cluster", "--name", CLUSTER, "--wait", "180s", timeout=600)
    for image in (IMAGE, SERVER_IMAGE, MODEL_IMAGE):
        run(kind, "load", "docker-image", image, "--name", CLUSTER, timeout=600)


@dataclass(frozen=True)
class Release:
    """One `helm upgrade --install` of the e2e: the release, its chart, its namespace (None: the
    kubeconfig's) and the values flags (`--values`, `--set`, `--set-json`)."""

    name: str
    chart: Path
    namespace: str | None
    values: tuple[str, ...] = ()

    def install_args(self) -> list[str]:
        """The arguments of `helm upgrade --install` (the cluster comes from --kubeconfig, added by the
        caller)."""
        ns = ["--namespace", self.namespace, "--create-namespace"] if self.namespace else []
        return ["upgrade", "--install", self.name, str(self.chart), *ns, *self.values,
                "--wait", "--timeout", "5m"]

    def template_args(self) -> list[str]:
        """`helm template` with exactly the same release, chart, namespace and values: what the install
        would apply, rendered offline (tests/chart/test_e2e_install.py validates it)."""
        ns = ["--namespace", self.namespace] if self.namespace else []
        return ["template", self.name, str(self.chart), *ns, *self.values]


def releases() -> list[Release]:
    """The e2e's two releases, in install order: the CRDs, then the chart with the CPU example values, the
    images built here, and no fleet or prefix from values (the test applies its own, see manifests())."""
    return [
        Release("llamafleet-crds", CRD_CHART, None),
        Release(RELEASE, CHART, NAMESPACE, (
            "--values", str(CHART / "examples" / "values-cpu-test.yaml"),
            "--set", f"image.repository={IMAGE.split(':')[0]}", "--set", f"image.tag={TAG}",
            "--set-json", "fleets=[]", "--set-json", "sharedPrefixes=[]")),
    ]


def install_chart(helm: Path, kubeconfig: Path) -> None:
    for release in releases():
        run(helm, "--kubeconfig", str(kubeconfig), *release.install_args())


def manifests(profile: Any) -> list[dict[str, Any]]:
    """A two-pod CPU fleet of the tiny model (baked into an image) and the profile's shared prefix."""
    fleet = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet",
        "metadata": {"name": "tiny", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": MODEL, "file": f"{MODEL}.gguf",
                      "source": {"image": {"reference": MODEL_IMAGE, "path": "/gguf"}}},
            "image": SERVER_IMAGE, "agentImage": IMAGE, "replicas": 2, "slots": 2, "contextPerSlot": 8192,
            "flashAttention": "off", "threads": 1,
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
            "snapshots": {"storage": "disk", "sizeLimit": "1Gi"},
            "prefixSharing": {"attach": "off"},
        },
    }
    prefix = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix",
        "metadata": {"name": "agent", "namespace": NAMESPACE},
        "spec": {"fleetRef": {"name": "tiny"}, "tools": list(profile.tools),
                 "messages": [{"role": "system", "content": profile.system_prompt}]},
    }
    return [fleet, prefix]


def refused_manifests(profile: Any) -> list[tuple[str, dict[str, Any], str]]:
    """Fleets the cluster must refuse at `kubectl apply`, each with the message that says why: one by the
    chart's ValidatingAdmissionPolicy (a hostPath of `/`), one by the CRD's own CEL (attach without a
    unified KV cache). tests/chart/test_e2e_install.py checks offline that both are refused as expected
    and that manifests() is admitted."""
    fleet, _ = manifests(profile)
    root = copy.deepcopy(fleet)
    root["metadata"]["name"] = "root-path"
    root["spec"]["model"]["source"] = {"hostPath": "/"}
    attach = copy.deepcopy(fleet)
    attach["metadata"]["name"] = "attach-split-cache"
    attach["spec"]["prefixSharing"] = {"attach": "on"}
    attach["spec"]["kvUnified"] = False
    return [("admission policy", root, "spec.model.source.hostPath"),
            ("CRD rule", attach, "prefixSharing.attach: on needs kvUnified: true")]


def assert_refused(kubectl_args: Sequence[str | Path],
                   refused: Sequence[tuple[str, dict[str, Any], str]]) -> None:
    """Each manifest is refused by the API server (a server-side dry run: nothing is created either way)."""
    for what, manifest, message in refused:
        args = [str(a) for a in kubectl_args] + ["apply", "--dry-run=server", "-f", "-"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=120,
                                input=yaml.safe_dump(manifest))
        assert result.returncode != 0, f"the {what} admitted {manifest['metadata']['name']}"
        assert message in result.stderr, f"the {what} refused it for another reason: {result.stderr[-2000:]}"
        log(f"refused by the {what}: {manifest['metadata']['name']}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def port_forward(kubectl: Path, kubeconfig: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(kubectl), "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, "port-forward", "--address",
         "127.0.0.1", f"svc/{GATEWAY_SERVICE}", f"{port}:80"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("kubectl port-forward to the gateway did not open within 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def send_sessions(url: str, profile: Any, questions: Sequence[str]) -> list[dict[str, Any]]:
    """One request per session (same tools and system prompt, a different question); what reuse each got."""
    out = []
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30, read=300)) as http:
        for question in questions:
            response = http.post("/v1/chat/completions", json=profile.request(MODEL, question, stream=False))
            response.raise_for_status()
            timings = response.json().get("timings") or {}
            out.append({"action": response.headers.get("x-llamafleet-action"),
                        "pod": response.headers.get("x-llamafleet-pod"),
                        "cache_n": int(timings.get("cache_n", 0)),
                        "prompt_n": int(timings.get("prompt_n", 0))})
            log(f"session: {out[-1]}")
    return out


def assert_prefix_reuse(results: Sequence[dict[str, Any]]) -> None:
    """Every session finds the shared prefix already in its slot (warmed by the SharedPrefix): most of
    its prompt is reused and only the question and template tail are computed."""
    for i, r in enumerate(results):
        total = r["cache_n"] + r["prompt_n"]
        assert total > 0, f"session {i}: no timings in the response"
        assert r["cache_n"] / total >= 0.8, f"session {i} reused only {r['cache_n']}/{total} tokens: {r}"


def main(argv: Sequence[str] | None = None) -> int:
    reason = missing_prerequisite()
    if reason is not None:
        print(f"SKIPPED kind end-to-end test: {reason}; it needs a Docker engine and kind "
              "(see e2e/README.md)")
        return SKIPPED
    from llamafleet_testbed import helm as tools
    from llamafleet_testbed.tinymodels import ensure_model
    from llamafleet_testbed.workload import WorkloadSpec, make_profile

    kind = os.environ.get("KIND", "kind")
    helm, kubectl = tools.helm(), tools.kubectl()
    build_images(ensure_model(MODEL))
    create_cluster(kind)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(run(kind, "get", "kubeconfig", "--name", CLUSTER))
        try:
            install_chart(helm, kubeconfig)
            profile = make_profile(WorkloadSpec(prefix_chars=PREFIX_CHARS))
            kc = (kubectl, "--kubeconfig", kubeconfig, "-n", NAMESPACE)
            assert_refused(kc, refused_manifests(profile))
            run(*kc, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests(profile)))
            run(*kc, "wait", "--for=condition=Ready", "llamafleet/tiny", "--timeout=900s", timeout=960)
            run(*kc, "wait", "--for=condition=Ready", "sharedprefix/agent", "--timeout=600s", timeout=660)
            log(run(*kc, "get", "llamafleets,sharedprefixes,pods", "-o", "wide"))
            with port_forward(kubectl, kubeconfig) as url:
                results = send_sessions(url, profile, [f"Please explain step {i} of the build." for i in
                                                       range(SESSIONS)])
            assert_prefix_reuse(results)
            print(json.dumps({"sessions": results}))
            print("PASSED kind end-to-end test")
            return 0
        except Exception:
            log(run(kubectl, "--kubeconfig", kubeconfig, "get", "all,events", "-A", check=False)[-6000:])
            raise
        finally:
            if not os.environ.get("LLAMAFLEET_E2E_KEEP"):
                run(kind, "delete", "cluster", "--name", CLUSTER, check=False, timeout=300)


if __name__ == "__main__":
    sys.exit(main())

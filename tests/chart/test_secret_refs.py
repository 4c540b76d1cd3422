"""Every Secret a rendered pod needs exists where the pod runs, and generated Secrets survive upgrades.

A pod whose Secret volume names a Secret missing from its namespace hangs in ContainerCreating; one whose
`secretKeyRef` or `envFrom` names a missing Secret fails with CreateContainerConfigError. Neither shows in
`helm template`, so this checks it: every Secret a pod template mounts or reads is either rendered by the
chart in the pod's own namespace or one the user named in the values (an `existingSecret`, an
`imagePullSecrets` entry), over the default values, the example values files and the namespace-scope and
existing-secret cases.

The upgrade tests render with `--dry-run=server` against a fake API server (tests/chart/fake_apiserver.py)
that holds the Secrets an earlier release left, so the chart's `lookup` calls see a cluster.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, EXAMPLES, NAMESPACE, RELEASE, Helm, Manifest, by_kind
from tests.chart.fake_apiserver import FakeApiServer

CASES: list[Any] = [
    pytest.param((), {}, id="defaults"),
    *(pytest.param((p,), {}, id=p.stem) for p in EXAMPLES),
    pytest.param((), {"operator": {"watchNamespaces": ["team-a", "team-b"]}}, id="watch-team-a-team-b"),
    pytest.param((), {"operator": {"watchNamespaces": [NAMESPACE, "team-a"]}},
                 id="watch-release-namespace-too"),
    pytest.param((EXAMPLES[0],), {"operator": {"watchNamespaces": ["team-a"]}},
                 id=f"{EXAMPLES[0].stem}-watch-team-a"),
    pytest.param((), {"operator": {"clusterWide": True}}, id="cluster-wide"),
    pytest.param((), {"operator": {"watchNamespaces": ["team-a"]},
                      "agentToken": {"existingSecret": "my-agent-token"},
                      "gateway": {"apiKeys": {"existingSecret": "my-api-keys"}},
                      "redis": {"enabled": False, "external": {"existingSecret": "my-redis"}},
                      "imagePullSecrets": [{"name": "my-registry"}]},
                 id="existing-secrets"),
]


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def user_secrets(values: list[Any]) -> set[str]:
    """Secrets the user names in the values and must create: `existingSecret`s and `imagePullSecrets`."""
    out: set[str] = set()
    for doc in values:
        for key, value in walk(doc):
            if key == "existingSecret" and value:
                out.add(value)
            elif key == "imagePullSecrets":
                out.update(s["name"] for s in value)
    return out


def pod_specs(obj: Manifest) -> Iterator[Manifest]:
    """Every pod spec inside a built-in object (Deployment, StatefulSet, DaemonSet, Job, CronJob, Pod...):
    any mapping with a `containers` list, in the API groups that hold pods (core, apps, batch). Custom
    resources are skipped: their specs are not pod specs."""
    if obj["apiVersion"].rpartition("/")[0] not in ("", "apps", "batch"):
        return
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def secret_refs(spec: Manifest) -> Iterator[tuple[str, str]]:
    """(where, Secret name) for each Secret the pod mounts or reads."""
    for vol in spec.get("volumes", []):
        if "secret" in vol:
            yield f"volume {vol['name']}", vol["secret"]["secretName"]
        for source in vol.get("projected", {}).get("sources", []):
            if "secret" in source:
                yield f"projected volume {vol['name']}", source["secret"]["name"]
    for s in spec.get("imagePullSecrets", []):
        yield "imagePullSecrets", s["name"]
    for c in [*spec["containers"], *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                yield f"container {c['name']} env {e['name']}", ref["name"]
        for e in c.get("envFrom", []):
            if "secretRef" in e:
                yield f"container {c['name']} envFrom", e["secretRef"]["name"]


def missing_secrets(objs: list[Manifest], allowed: set[str]) -> list[str]:
    rendered = {(s["metadata"].get("namespace", NAMESPACE), s["metadata"]["name"])
                for s in by_kind(objs, "Secret")}
    problems = []
    for obj in objs:
        namespace = obj["metadata"].get("namespace", NAMESPACE)
        for spec in pod_specs(obj):
            for where, name in secret_refs(spec):
                if (namespace, name) not in rendered and name not in allowed:
                    problems.append(f"{obj['kind']}/{obj['metadata']['name']} in {namespace}: {where} needs "
                                    f"Secret {name}, which is neither rendered there nor named in the values")
    return problems


@pytest.mark.parametrize(("files", "values"), CASES)
def test_every_secret_a_pod_needs_is_there(helm: Helm, tmp_path: Path, files: tuple[Path, ...],
                                           values: dict[str, Any]) -> None:
    extra = tmp_path / "values.yaml"
    extra.write_text(yaml.safe_dump(values))
    objs = helm.template(*files, extra)
    allowed = user_secrets([*(yaml.safe_load(f.read_text()) for f in files), values])
    assert not missing_secrets(objs, allowed)
    checked = [ref for o in objs for spec in pod_specs(o) for ref in secret_refs(spec)]
    assert len(checked) >= 2, "the gateway and the operator mount the agent token at least"
    names = {s["metadata"]["name"] for s in by_kind(objs, "Secret")}
    assert not names & allowed, "the chart must not overwrite a Secret the user brings"


def test_the_check_finds_a_missing_secret() -> None:
    """The check above can fail: a Deployment mounting a Secret rendered only in another namespace."""
    pod = {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "env"}}]}],
           "volumes": [{"name": "t", "secret": {"secretName": "token"}}]}
    objs = [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "a"},
             "spec": {"template": {"spec": pod}}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "b"}}]
    problems = missing_secrets(objs, allowed=set())
    assert len(problems) == 2 and "volume t needs Secret token" in problems[0] + problems[1]
    assert missing_secrets(objs, allowed={"token", "env"}) == []


def token_secrets(objs: list[Manifest]) -> dict[str, str]:
    return {s["metadata"]["namespace"]: base64.b64decode(s["data"]["token"]).decode()
            for s in by_kind(objs, "Secret") if s["metadata"]["name"].endswith("agent-token")}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    fake = FakeApiServer()
    with fake.running():
        yield fake, fake.kubeconfig(tmp_path, NAMESPACE)


def upgrade(helm: Helm, kubeconfig: Path, *sets: str) -> list[Manifest]:
    """What `helm upgrade` would apply, with `lookup` answered by the fake cluster."""
    args = ["template", RELEASE, str(CHART),
            "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig), "--dry-run=server"]
    for s in sets:
        args += ["--set", s]
    return helm.render(*args)


WATCH = "operator.watchNamespaces={team-a,team-b}"
TOKEN = "token-of-the-first-install-0123456789"


def test_upgrade_keeps_the_master_agent_token_of_the_release_namespace(
        helm: Helm, cluster: tuple[FakeApiServer, Path]) -> None:
    """The master token lives in the release namespace only (fleet namespaces get derived tokens, written
    by the operator), and an upgrade keeps it."""
    fake, kubeconfig = cluster
    fake.put_secret(NAMESPACE, f"{RELEASE}-llamafleet-agent-token", token=TOKEN, scope="master")
    assert token_secrets(upgrade(helm, kubeconfig)) == {NAMESPACE: TOKEN}
    assert token_secrets(upgrade(helm, kubeconfig, WATCH)) == {NAMESPACE: TOKEN}
    assert any(r.startswith(f"/api/v1/namespaces/{NAMESPACE}/secrets/") for r in fake.requests)


def test_upgrade_replaces_a_token_that_fleet_namespaces_held(
        helm: Helm, cluster: tuple[FakeApiServer, Path]) -> None:
    """An older release copied its one token into every watched namespace, where fleet pods mounted it:
    whoever runs a fleet there knows it, so it must not become the master the namespaces' tokens derive
    from. The upgrade generates a new master (issue 22, finding 3)."""
    fake, kubeconfig = cluster
    fake.put_secret(NAMESPACE, f"{RELEASE}-llamafleet-agent-token", token=TOKEN)
    fake.put_secret("team-b", f"{RELEASE}-llamafleet-agent-token", token=TOKEN)
    tokens = token_secrets(upgrade(helm, kubeconfig, WATCH))
    assert sorted(tokens) == [NAMESPACE] and tokens[NAMESPACE] != TOKEN


def test_without_a_token_in_the_cluster_one_is_generated(
        helm: Helm, cluster: tuple[FakeApiServer, Path]) -> None:
    _, kubeconfig = cluster
    tokens = token_secrets(upgrade(helm, kubeconfig, WATCH))
    assert sorted(tokens) == [NAMESPACE]
    (token,) = set(tokens.values())
    assert len(token) == 48 and token != TOKEN


def test_upgrade_keeps_the_generated_api_keys(helm: Helm, cluster: tuple[FakeApiServer, Path]) -> None:
    fake, kubeconfig = cluster
    fake.put_secret(NAMESPACE, f"{RELEASE}-llamafleet-api-keys", **{"api-keys": "default:sk-kept\n"})
    (keys,) = [s for s in by_kind(upgrade(helm, kubeconfig), "Secret") if "api-keys" in s["data"]]
    assert base64.b64decode(keys["data"]["api-keys"]).decode() == "default:sk-kept\n"

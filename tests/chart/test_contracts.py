"""What the chart promises the rest of the system: least-privilege RBAC, the labels the operator's
NetworkPolicy admits, probes, non-root pods, one agent-token Secret name everywhere.

Golden snippets pin the parts that matter; regenerate after an intended change with
`UPDATE_GOLDEN=1 pytest tests/chart`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core import labels as L
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.render import Target, render_network_policy
from tests.chart.conftest import NAMESPACE, Helm, Manifest, by_kind, dump, one, pod_spec

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, obj: Any) -> None:
    path = GOLDEN / f"{name}.yaml"
    text = dump(obj)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.is_file(), f"missing {path}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs: run with UPDATE_GOLDEN=1 if the change is intended"


@pytest.fixture(scope="module")
def default(helm: Helm) -> list[Manifest]:
    return helm.template()


def workloads(objs: list[Manifest]) -> list[Manifest]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def test_rbac_matches_golden(default: list[Manifest]) -> None:
    """The operator's rules, verb by verb."""
    rbac = {f"{o['kind']}/{o['metadata']['name']}": o["rules"]
            for o in default if o["kind"] in ("Role", "ClusterRole")}
    check_golden("rbac", rbac)


def test_rbac_is_least_privilege_in_namespace_scope(default: list[Manifest]) -> None:
    """No wildcards; of Secrets only the fleet agent-token Secret by name (plus create, which reads
    nothing); nothing cluster-wide but reading CRDs; pods are read-only."""
    rules = [r for o in default if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        if "secrets" in rule["resources"]:
            assert rule["resources"] == ["secrets"]
            assert rule["verbs"] == ["create"] or (
                rule["verbs"] == ["get", "patch"]
                and rule["resourceNames"] == ["lf-llamafleet-fleet-agent-token"]), rule
    (cluster,) = by_kind(default, "ClusterRole")
    read_crds = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "verbs": ["get", "list", "watch"]}
    assert cluster["rules"] == [read_crds]
    pods = next(r for r in rules if r["resources"] == ["pods"])
    assert pods["verbs"] == ["get", "list", "watch"]
    (role,) = by_kind(default, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE


def test_rbac_follows_the_watched_namespaces(helm: Helm) -> None:
    """One Role per watched namespace; the master agent token only in the release namespace (where the
    gateway and the operator mount it: the operator writes each fleet namespace's own, derived one);
    clusterWide switches to a ClusterRole."""
    objs = helm.template(sets=("operator.watchNamespaces={team-a,team-b}",))
    assert sorted(r["metadata"]["namespace"] for r in by_kind(objs, "Role")) == ["team-a", "team-b"]
    tokens = [s for s in by_kind(objs, "Secret") if s["metadata"]["name"].endswith("agent-token")]
    assert [s["metadata"]["namespace"] for s in tokens] == [NAMESPACE]
    same = helm.template(sets=(f"operator.watchNamespaces={{{NAMESPACE},team-a}}",))
    tokens = [s for s in by_kind(same, "Secret") if s["metadata"]["name"].endswith("agent-token")]
    assert [s["metadata"]["namespace"] for s in tokens] == [NAMESPACE]
    wide = helm.template(sets=("operator.clusterWide=true",))
    assert not by_kind(wide, "Role")
    rules = [r for o in by_kind(wide, "ClusterRole") for r in o["rules"]]
    assert any("secrets" in r["resources"] for r in rules)
    assert any("namespaces" in r["resources"] for r in rules)


def test_network_policies_match_golden(default: list[Manifest]) -> None:
    policies = {o["metadata"]["name"]: o["spec"] for o in by_kind(default, "NetworkPolicy")}
    check_golden("networkpolicies", policies)


def test_probes_match_golden(default: list[Manifest]) -> None:
    probes = {
        f"{w['metadata']['name']}/{c['name']}": {k: c[k] for k in ("startupProbe", "readinessProbe",
                                                                    "livenessProbe") if k in c}
        for w in workloads(default) for c in pod_spec(w)["containers"]
    }
    check_golden("probes", probes)
    assert all(p for p in probes.values()), "every container needs a probe"


def test_gateway_and_operator_pods_pass_the_fleet_network_policy(default: list[Manifest]) -> None:
    """The operator's per-fleet NetworkPolicy selects peers by labels; the chart's pods must match them,
    or the gateway cannot reach llama-server and the operator cannot reach the agents."""
    fleet = LlamaFleet.model_validate({
        "metadata": {"name": "f", "namespace": NAMESPACE},
        "spec": {"image": "x", "model": {"name": "m", "file": "m.gguf", "source": {"pvc": "models"}}}})
    policy = render_network_policy(fleet, Target.of(fleet, operator_namespace=NAMESPACE,
                                                    gateway_namespace=NAMESPACE))
    peers = [p["podSelector"]["matchLabels"] for p in policy["spec"]["ingress"][0]["from"]]
    for component in ("gateway", "operator"):
        labels = one(default, "Deployment", component)["spec"]["template"]["metadata"]["labels"]
        assert labels[L.COMPONENT] == component and labels[L.APP_PART_OF] == L.PART_OF
        assert any(all(labels.get(k) == v for k, v in peer.items()) for peer in peers), component


def test_every_pod_runs_non_root_read_only_with_requests(helm: Helm) -> None:
    objs = helm.template(sets=("gateway.pipeline.scorers[0].type=prefix",))
    for w in workloads(objs):
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), "writable /tmp"


def test_only_the_operator_gets_an_api_token(default: list[Manifest]) -> None:
    tokens = {w["metadata"]["name"]: pod_spec(w)["automountServiceAccountToken"] for w in workloads(default)}
    assert tokens == {"lf-llamafleet-gateway": False, "lf-llamafleet-operator": True,
                      "lf-llamafleet-redis": False}


def env(container: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_one_agent_token_secret_for_operator_gateway_and_pods(default: list[Manifest]) -> None:
    """Gateway and operator mount the master; the operator tells rendered pods to mount another Secret,
    the one it writes into their namespace with that namespace's derived token."""
    (secret,) = [s for s in by_kind(default, "Secret") if "token" in s["data"]]
    name = secret["metadata"]["name"]
    operator = one(default, "Deployment", "operator")
    fleet_secret = env(pod_spec(operator)["containers"][0])["LLAMAFLEET_OPERATOR_AGENT_TOKEN_SECRET"]
    assert fleet_secret == "lf-llamafleet-fleet-agent-token" and fleet_secret != name
    for w in (operator, one(default, "Deployment", "gateway")):
        vol = next(v for v in pod_spec(w)["volumes"] if v["name"] == "agent-token")
        assert vol["secret"]["secretName"] == name


def test_gateway_listens_on_all_addresses_with_keys_and_redis(default: list[Manifest]) -> None:
    gateway = pod_spec(one(default, "Deployment", "gateway"))["containers"][0]
    assert gateway["args"][:3] == ["router", "--host=0.0.0.0", "--port=8000"]
    keys = next(a for a in gateway["args"] if a.startswith("--api-keys-file="))
    assert keys.endswith("/api-keys")
    # The password from the redis-auth Secret, expanded by the kubelet (tests/security/test_redis_auth.py).
    assert env(gateway)["LLAMAFLEET_ROUTER_REDIS_URL"] == (
        "redis://:$(LLAMAFLEET_REDIS_PASSWORD)@lf-llamafleet-redis.llamafleet.svc:6379/0")
    assert one(default, "Deployment", "gateway")["spec"]["replicas"] == 2
    (keys_secret,) = [s for s in by_kind(default, "Secret") if "api-keys" in s["data"]]
    assert keys_secret["metadata"]["name"] == "lf-llamafleet-api-keys"


def test_external_redis_from_a_secret_replaces_the_bundled_one(helm: Helm) -> None:
    objs = helm.template(sets=("redis.enabled=false", "redis.external.existingSecret=my-redis"))
    assert not by_kind(objs, "StatefulSet")
    gateway = pod_spec(one(objs, "Deployment", "gateway"))["containers"][0]
    assert env(gateway)["LLAMAFLEET_ROUTER_REDIS_URL"] == {"secretKeyRef": {"name": "my-redis", "key": "url"}}
    assert all("redis" not in p["metadata"]["name"] for p in by_kind(objs, "NetworkPolicy"))


@pytest.mark.parametrize(("url", "port"), [
    ("redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster/0", 26379),
    ("redis+cluster://:pw@redis-0.redis:6379,redis-1.redis:6379", 6379),
    ("rediss+cluster://redis-0.redis:6380", 6380),
])
def test_an_external_sentinel_or_cluster_is_one_url_for_gateway_and_operator(
        helm: Helm, url: str, port: int) -> None:
    """A Sentinel or Cluster URL passes the values schema and reaches the gateway and the operator as is
    (the index and membership clients ask the Sentinels for the master, or the Cluster for its slot map);
    the egress policy lets them reach its port. A URL of another scheme is refused by the schema."""
    escaped = url.replace(",", "\\,")  # --set splits at commas
    objs = helm.template(sets=("redis.enabled=false", f"redis.external.url={escaped}"))
    for name in ("gateway", "operator"):
        container = pod_spec(one(objs, "Deployment", name))["containers"][0]
        assert url in env(container).values(), name
    ports = [p["port"] for pol in by_kind(objs, "NetworkPolicy") for rule in pol["spec"].get("egress") or ()
             for p in rule.get("ports") or ()]
    assert port in ports
    assert "redis.external.url" in helm.template_error("redis.enabled=false", "redis.external.url=memcached://x")

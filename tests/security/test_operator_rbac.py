"""Finding 16: with `clusterWide` the operator could read and patch every Secret in the cluster.

Now it may `get` and `patch` only the fleet namespaces' agent-token Secret, by name, and `create` (which
reads nothing and cannot be limited by name); no list, no watch, no delete, no other name, in either
scope. Checked on the chart's rendered RBAC with the API server's rule semantics; that the operator's
code only ever asks for that name is checked against the emulated API in test_fleet_admission.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafleet_testbed import helm

ROOT = Path(__file__).parents[2]
TOKEN_SECRET = "lf-llamafleet-fleet-agent-token"
SCOPES = {"cluster-wide": ("operator.clusterWide=true",), "namespaces": ("operator.watchNamespaces={a,b}",)}


def rules(*sets: str) -> list[dict[str, Any]]:
    """Every rule bound to the operator's service account (Roles and ClusterRoles alike)."""
    chart = ROOT / "charts" / "llamafleet"
    argv = [str(helm.helm()), "template", "lf", str(chart), "--namespace", "llamafleet"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objs
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == "lf-llamafleet-operator" for s in b["subjects"])}
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    return [r for o in roles if (o["kind"], o["metadata"]["name"]) in bound for r in o["rules"]]


def allows(granted: list[dict[str, Any]], verb: str, resource: str, name: str | None = None) -> bool:
    """RBAC: some rule names the group, the resource and the verb (or `*`), and either lists no
    resourceNames or lists this name (a request without a name, like list or create, matches only
    rules without resourceNames)."""
    for rule in granted:
        if "" not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule["resources"] and "*" not in rule["resources"]:
            continue
        if verb not in rule["verbs"] and "*" not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if not names or (name is not None and name in names):
            return True
    return False


@pytest.mark.parametrize("scope", sorted(SCOPES))
def test_the_operator_reaches_only_its_own_secret(scope: str) -> None:
    granted = rules(*SCOPES[scope])
    assert allows(granted, "get", "secrets", TOKEN_SECRET)
    assert allows(granted, "patch", "secrets", TOKEN_SECRET)
    assert allows(granted, "create", "secrets")
    for verb, name in [("get", "kube-system-admin-token"), ("get", "lf-llamafleet-agent-token"),
                       ("patch", "someone-elses"), ("list", None), ("watch", None), ("delete", TOKEN_SECRET),
                       ("update", TOKEN_SECRET), ("deletecollection", None)]:
        assert not allows(granted, verb, "secrets", name), (verb, name)


def test_the_evaluator_can_fail() -> None:
    """The rule the chart had before: get, create, patch on every Secret."""
    old = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]}]
    assert allows(old, "get", "secrets", "kube-system-admin-token")
    assert not allows([{**old[0], "resourceNames": [TOKEN_SECRET]}], "get", "secrets", "other")

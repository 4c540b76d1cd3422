"""The membership signing key (finding 6): generated and kept like the other Secrets, mounted by the
operator (which signs fleet membership entries) and the gateway (which checks them), and by nothing else:
a fleet pod that held it could sign a member of its own choosing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import EXAMPLES, Helm, Manifest, by_kind, dump, pod_spec
from tests.chart.test_secret_refs import pod_specs, secret_refs

GENERATED = "lf-llamafleet-membership-key"
KEEP = "helm.sh/resource-policy"
ENV = {"operator": "LLAMAFLEET_OPERATOR_MEMBERSHIP_KEY_FILE",
       "gateway": "LLAMAFLEET_ROUTER_MEMBERSHIP_KEY_FILE"}


def holders(objs: list[Manifest], secret: str) -> set[str]:
    """Names of the objects whose pods mount or read `secret`."""
    return {o["metadata"]["name"] for o in objs for spec in pod_specs(o)
            for _, name in secret_refs(spec) if name == secret}


def key_file(workload: Manifest, variable: str) -> str:
    """The file `variable` names, checked to lie in a mount of the membership key's volume."""
    spec = pod_spec(workload)
    main = spec["containers"][0]
    path: str = next(e["value"] for e in main["env"] if e["name"] == variable)
    mount = next(m for m in main["volumeMounts"] if m["name"] == "membership-key")
    assert path.startswith(mount["mountPath"] + "/"), dump(main)
    volume = next(v for v in spec["volumes"] if v["name"] == "membership-key")
    assert volume["secret"]["items"] == [{"key": "key", "path": path.rpartition("/")[2]}]
    return str(volume["secret"]["secretName"])


@pytest.mark.parametrize("files", [(), *((p,) for p in EXAMPLES)],
                         ids=["defaults", *(p.stem for p in EXAMPLES)])
def test_only_the_operator_and_the_gateway_mount_the_membership_key(helm: Helm, files: Any) -> None:
    objs = helm.template(*files)
    [secret] = [s for s in by_kind(objs, "Secret") if s["metadata"]["name"] == GENERATED]
    assert secret["metadata"]["annotations"][KEEP] == "keep"
    assert set(secret["data"]) == {"key"}
    workloads = {o["metadata"]["name"]: o for o in by_kind(objs, "Deployment")}
    expected = {name for name in workloads if name.endswith(("-operator", "-gateway"))}
    assert holders(objs, GENERATED) == expected and any(n.endswith("-operator") for n in expected)
    for name in expected:
        role = "operator" if name.endswith("-operator") else "gateway"
        assert key_file(workloads[name], ENV[role]) == GENERATED


def test_a_given_key_is_not_generated_and_an_existing_secret_is_mounted(helm: Helm) -> None:
    given = helm.template(sets=("membershipKey.value=a-membership-key-of-16-plus",))
    [secret] = [s for s in by_kind(given, "Secret") if s["metadata"]["name"] == GENERATED]
    assert KEEP not in secret["metadata"].get("annotations", {})
    brought = helm.template(sets=("membershipKey.existingSecret=my-membership-key",))
    assert GENERATED not in {s["metadata"]["name"] for s in by_kind(brought, "Secret")}
    assert holders(brought, "my-membership-key") == {"lf-llamafleet-operator", "lf-llamafleet-gateway"}
    assert "membershipKey.value" in helm.template_error("membershipKey.value=short")

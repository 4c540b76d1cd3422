"""GitOps: Secrets the chart generates never rotate silently (issue 23, deployment defects).

Under `helm template` (how Argo CD renders) `lookup` finds nothing, so a generated Secret would get new
values on every sync. The chart marks what it generates `helm.sh/resource-policy: keep` and names it in
NOTES.txt with a warning; with `gitOps: true` it generates nothing and refuses to render until every
Secret is given, so two renders are byte-identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.conftest import Helm, Manifest, by_kind, pod_spec
from tests.chart.notes import render_notes
from tests.chart.test_secret_refs import missing_secrets

KEEP = "helm.sh/resource-policy"
BROUGHT = ("agentToken.existingSecret=my-agent-token", "gateway.apiKeys.existingSecret=my-api-keys",
           "redis.auth.existingSecret=my-redis", "membershipKey.existingSecret=my-membership-key")
GENERATED = {"lf-llamafleet-agent-token", "lf-llamafleet-api-keys", "lf-llamafleet-redis-auth",
             "lf-llamafleet-membership-key"}


def secrets(objs: list[Manifest]) -> dict[str, Manifest]:
    return {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}


def test_generated_secrets_are_kept_and_given_ones_are_not_marked(helm: Helm) -> None:
    generated = secrets(helm.template())
    assert set(generated) == GENERATED
    for name, secret in generated.items():
        assert secret["metadata"]["annotations"][KEEP] == "keep", name
    # Values from the values file are not generated: nothing to keep, and they never change.
    given = secrets(helm.template(sets=("agentToken.value=a-token-of-sixteen-plus",
                                        "gateway.apiKeys.keys.ci=sk-ci-key-1")))
    for name in ("lf-llamafleet-agent-token", "lf-llamafleet-api-keys"):
        assert KEEP not in given[name]["metadata"].get("annotations", {}), name


def test_gitops_refuses_to_generate_and_names_every_missing_secret(helm: Helm) -> None:
    error = helm.template_error("gitOps=true")
    for value in ("agentToken.existingSecret", "gateway.apiKeys.existingSecret", "redis.auth.existingSecret",
                  "membershipKey.existingSecret"):
        assert value in error
    # One given, the others still named.
    error = helm.template_error("gitOps=true", BROUGHT[0])
    assert "agentToken.existingSecret" not in error and "gateway.apiKeys.existingSecret" in error


def test_gitops_with_existing_secrets_renders_the_same_every_time(helm: Helm) -> None:
    sets = ("gitOps=true", *BROUGHT)
    first, second = helm.template(sets=sets), helm.template(sets=sets)
    assert first == second, "a GitOps render must be reproducible: nothing random"
    assert not secrets(first), "the chart renders none of the Secrets the user brings"
    assert not missing_secrets(first, allowed={"my-agent-token", "my-api-keys", "my-redis",
                                                            "my-membership-key"})
    gateway = next(o for o in by_kind(first, "Deployment") if o["metadata"]["name"].endswith("gateway"))
    mounted = {v["secret"]["secretName"] for v in pod_spec(gateway)["volumes"] if "secret" in v}
    assert {"my-agent-token", "my-api-keys"} <= mounted


def test_without_gitops_two_renders_differ_which_notes_warn_about(helm: Helm, tmp_path: Path) -> None:
    """Why the switch exists: without a cluster every render generates new values."""
    tokens = [secrets(helm.template())["lf-llamafleet-agent-token"]["data"]["token"] for _ in range(2)]
    assert tokens[0] != tokens[1]
    notes = render_notes(helm, tmp_path)
    assert "WARNING (GitOps)" in notes and "gitOps: true" in notes
    for value in ("agentToken.existingSecret", "gateway.apiKeys.existingSecret", "redis.auth.existingSecret"):
        assert value in notes


@pytest.mark.parametrize("sets", [("gitOps=true", *BROUGHT), BROUGHT])
def test_no_gitops_warning_when_nothing_is_generated(
        helm: Helm, tmp_path: Path, sets: tuple[str, ...]) -> None:
    assert "GitOps" not in render_notes(helm, tmp_path, *sets)

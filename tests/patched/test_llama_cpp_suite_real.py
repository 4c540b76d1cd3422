"""llama.cpp's own server tests, on both builds: with its flags off, the patched server passes every test
the upstream one passes.

The suite (tools/server/tests of the pinned tree) downloads its models from Hugging Face; here its
conftest is replaced by one that points every preset at a local tiny model and runs offline. Many of
its tests then fail on both builds (they expect the stories260K model's words), so the check is
differential: the same files, the same model, one run per binary, and the patched run may not lose a
test the upstream run passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llamafleet_local.redis_server import free_port
from llamafleet_testbed.llama_build import source_dir
from tests.fixtures.llama import TinyModels

pytestmark = pytest.mark.llama

FILES = (
    "test_tokenize.py",
    "test_basic.py",
    "test_slot_save.py",
    "test_ctx_shift.py",
    "test_metrics.py",
    "test_template.py",
    "test_security.py",
    "test_ignore_eos.py",
)

LOCAL_CONFTEST = '''"""Offline on a local model (written by llamafleet in place of the suite's conftest)."""
import os

import pytest
from utils import ServerPreset, server_instances

LOCAL_MODEL = os.environ["LLAMAFLEET_LOCAL_MODEL"]


def _local(preset):
    def make():
        server = preset()
        server.model_hf_repo = server.model_hf_file = server.model_url = None
        server.model_file = LOCAL_MODEL
        server.offline = True
        return server
    return make


for _name, _value in list(vars(ServerPreset).items()):
    if isinstance(_value, staticmethod) and _name != "load_all":
        setattr(ServerPreset, _name, staticmethod(_local(_value.__func__)))


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()
'''


def _suite(work: Path) -> Path:
    tests = work / "tests"
    shutil.copytree(source_dir() / "tools" / "server" / "tests", tests)
    (tests / "conftest.py").write_text(LOCAL_CONFTEST)
    # utils imports wget for downloads, which an offline run never makes
    (tests / "wget.py").write_text("def download(*args, **kwargs):\n    raise RuntimeError('offline')\n")
    return tests


def _outcomes(tests: Path, binary: Path, model: Path, report: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(binary),
        "LLAMAFLEET_LOCAL_MODEL": str(model),
        "PORT": str(free_port()),
        "LLAMA_CACHE": str(tests / "cache"),
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *(f"unit/{f}" for f in FILES),
        ],
        cwd=tests,
        env=env,
        capture_output=True,
        timeout=1200,
    )
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = (
            "failed" if failed else "skipped" if skipped else "passed"
        )
    return outcomes


def test_the_patched_build_passes_every_llama_cpp_server_test_upstream_passes(
    llama_server_bin: Path, patched_llama_server_bin: Path, tiny_models: TinyModels, tmp_path: Path
) -> None:
    tests = _suite(tmp_path)
    upstream = _outcomes(tests, llama_server_bin, tiny_models.dense, tmp_path / "upstream.xml")
    patched = _outcomes(tests, patched_llama_server_bin, tiny_models.dense, tmp_path / "patched.xml")
    passed = {name for name, outcome in upstream.items() if outcome == "passed"}
    assert len(passed) >= 30, f"too few upstream passes to compare: {len(passed)} of {len(upstream)}"
    lost = sorted(name for name in passed if patched.get(name) != "passed")
    assert not lost, f"the patched build fails tests upstream passes: {lost}"

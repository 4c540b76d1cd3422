"""FLEET.yaml validation and the pure parts of `llamafleet up` (no processes)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from llamafleet_agent.cli import parse_settings
from llamafleet_core import podspec
from llamafleet_local.up import ConfigError, load_fleet, main
from llamafleet_local.up.pods import HOST, PodLayout, agent_args, server_argv
from llamafleet_local.up.progress import FleetProgress, PrefixProgress, line

ROOT = Path(__file__).resolve().parents[2]

FLEET = """\
apiVersion: llamafleet.io/v1alpha1
kind: LlamaFleet
metadata: {name: demo}
spec:
  model: {name: tiny, file: tiny.gguf, source: {hostPath: /models}}
  image: local
  replicas: 2
  slots: 2
  contextPerSlot: 4096
local:
  model: tiny-dense
  threads: 1
---
apiVersion: llamafleet.io/v1alpha1
kind: SharedPrefix
metadata: {name: sys}
spec:
  fleetRef: {name: demo}
  messages: [{role: system, content: You are terse.}]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_fleet(write(tmp_path, text))
    return str(info.value)


def test_valid_file_loads_fleet_local_settings_and_prefixes(tmp_path: Path) -> None:
    config = load_fleet(write(tmp_path, FLEET))
    assert config.name == "demo"
    assert config.local.model == "tiny-dense" and config.local.threads == 1
    assert [p.metadata.name for p in config.prefixes] == ["sys"]


def test_error_names_document_and_spec_field_when_value_out_of_range(tmp_path: Path) -> None:
    """The message says which document and which field (camelCase, as written), and why."""
    message = error_of(tmp_path, FLEET.replace("slots: 2", "slots: 0"))
    assert "document 1 (LlamaFleet 'demo')" in message
    assert "spec.slots:" in message and "greater than or equal to 1" in message


def test_error_names_local_field_when_local_value_is_bad(tmp_path: Path) -> None:
    message = error_of(tmp_path, FLEET.replace("threads: 1", "threads: zero"))
    assert "local.threads:" in message


def test_error_names_unknown_field_when_spec_has_a_typo(tmp_path: Path) -> None:
    message = error_of(tmp_path, FLEET.replace("contextPerSlot:", "contextPerSlots:"))
    assert "spec.contextPerSlots:" in message and "Extra inputs are not permitted" in message


def test_error_names_shared_prefix_field_when_its_spec_is_invalid(tmp_path: Path) -> None:
    message = error_of(tmp_path, FLEET.replace("messages: [{role: system, content: You are terse.}]",
                                               "messages: [{role: user, content: hi}]"))
    assert "document 2 (SharedPrefix 'sys')" in message and "spec.messages.0.role:" in message


def test_error_names_fleet_ref_when_prefix_points_at_another_fleet(tmp_path: Path) -> None:
    message = error_of(tmp_path, FLEET.replace("fleetRef: {name: demo}", "fleetRef: {name: other}"))
    assert "spec.fleetRef.name" in message and "'other'" in message


def test_error_names_text_from_when_a_prefix_references_a_config_map(tmp_path: Path) -> None:
    """No cluster holds ConfigMaps in local mode: say so, rather than warm an empty prefix."""
    message = error_of(tmp_path, FLEET.replace(
        "messages: [{role: system, content: You are terse.}]",
        "textFrom: {configMapKeyRef: {name: prompts, key: agent.txt}}"))
    assert "SharedPrefix 'sys': spec.textFrom: needs a cluster" in message


def test_error_when_local_mapping_is_missing_or_model_file_absent(tmp_path: Path) -> None:
    assert "local: required" in error_of(tmp_path, FLEET.replace("local:\n  model: tiny-dense\n", ""))
    message = error_of(tmp_path, FLEET.replace("model: tiny-dense", "model: nowhere.gguf"))
    assert "local.model: no such file: nowhere.gguf" in message


def test_error_names_kind_when_document_kind_is_unknown(tmp_path: Path) -> None:
    assert "kind: expected LlamaFleet or SharedPrefix, got 'Pod'" in error_of(
        tmp_path, FLEET + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")


def test_cli_exits_2_without_traceback_when_file_is_bad(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad FLEET.yaml is a user error: exit code 2, the field on stderr, no Python traceback."""
    code = main(["-f", str(write(tmp_path, FLEET.replace("replicas: 2", "replicas: -1")))])
    err = capsys.readouterr().err
    assert code == 2
    assert "spec.replicas:" in err and "Traceback" not in err


def test_shipped_local_example_loads() -> None:
    config = load_fleet(ROOT / "examples" / "local-fleet.yaml")
    spec = config.fleet.spec
    assert (spec.replicas, spec.slots, config.local.model) == (2, 4, "tiny-hybrid")
    assert len(config.prefixes) == 1


def test_server_argv_is_exactly_the_shared_renderer_with_local_settings_folded_in(tmp_path: Path) -> None:
    """`local.threads` and `local.chatTemplate` change the spec, never the rendering: the argv is
    `podspec.llama_server_args` of the effective spec, byte for byte."""
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    config = load_fleet(write(tmp_path, FLEET.replace("threads: 1", "threads: 1\n  chatTemplate: t.jinja")))
    spec = config.effective_spec(template)
    pod = PodLayout("demo-0", 1234, 1235, tmp_path / "snap", tmp_path)
    argv = server_argv(Path("/bin/llama-server"), spec, pod, Path("/m.gguf"))
    assert argv == ["/bin/llama-server", *podspec.llama_server_args(
        spec, model_path="/m.gguf", port=1234, slot_save_path=str(tmp_path / "snap"), host=HOST)]
    assert argv[argv.index("-t") + 1] == "1"
    assert argv[-2:] == ["--chat-template-file", str(template)]


def test_agent_cli_accepts_every_flag_the_shared_renderer_emits(tmp_path: Path) -> None:
    """The pod's agent command line, as the operator and `up` render it, parses in the agent's CLI."""
    config = load_fleet(write(tmp_path, FLEET))
    pod = PodLayout("demo-0", 1234, 1235, tmp_path / "snap", tmp_path)
    args = agent_args(config.fleet.spec, pod, Path("/m.gguf"), "demo", tmp_path / "token")
    settings = parse_settings([*args, "--attach"])
    assert settings.llama_url.endswith(":1234") and settings.model_file == Path("/m.gguf")
    assert settings.fleet == "demo" and settings.attach and settings.await_required


def test_progress_line_counts_pods_and_warm_prefixes() -> None:
    state = FleetProgress(pods_total=2, pods_up={"a-0"}, prefixes={"sys": PrefixProgress("sys")})
    assert line(state).startswith("pods up 1/2 | prefixes warm 0/1 | sys 0/2 pods")
    assert not state.ready

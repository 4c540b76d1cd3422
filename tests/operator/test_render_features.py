"""Prefix-sharing flags in rendered pods: the detector, and `auto` resolved from what the image reported."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.crd.models import ImageFeatures, LlamaFleet
from llamafleet_core.features import parse_help
from llamafleet_operator.reconcile import features as F
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.fleet import fleet_status
from llamafleet_operator.render import Target, render_all
from tests.operator.test_render import K8S_VERSION

IMAGE = "registry.example/llama-server:patched"


def fleet(**spec: Any) -> LlamaFleet:
    base: dict[str, Any] = {
        "model": {"name": "m", "file": "m.gguf", "source": {"url": "https://models.example/m.gguf"}},
        "image": IMAGE, "kvUnified": True,
    }
    return LlamaFleet.model_validate({"metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
                                      "spec": {**base, **spec}})


def record(image: str = IMAGE, **fields: Any) -> ImageFeatures:
    return ImageFeatures(image=image, **{"known": True, "slot_attach": True, "cache_prefix": True, **fields})


def pod_of(f: LlamaFleet, features: ImageFeatures | None) -> dict[str, Any]:
    deploy = next(o for o in render_all(f, Target.of(f, **F.support(features))) if o["kind"] == "Deployment")
    return dict(deploy["spec"]["template"])


def args(template: dict[str, Any], name: str) -> list[str]:
    return list(next(c for c in template["spec"]["containers"] if c["name"] == name)["args"])


def test_auto_with_supporting_image_and_unified_kv_turns_the_flags_on_in_server_and_agent() -> None:
    template = pod_of(fleet(), F.recorded(fleet().spec, record().to_k8s()))
    server, agent = args(template, "llama-server"), args(template, "agent")
    assert "--slot-attach" in server and "--cache-prefix" in server and "--attach" in agent
    assert template["metadata"]["annotations"][L.ATTACH] == "true"


def test_auto_stays_off_while_the_image_is_unknown_or_lacks_the_flags() -> None:
    for features in (None, record(known=False, slot_attach=False, cache_prefix=False),
                     record(slot_attach=False, cache_prefix=False)):
        template = pod_of(fleet(), features)
        assert "--slot-attach" not in args(template, "llama-server")
        assert "--cache-prefix" not in args(template, "llama-server")
        assert "--attach" not in args(template, "agent")
        assert template["metadata"]["annotations"][L.ATTACH] == "false"


def test_record_of_another_image_is_ignored_so_auto_is_off_until_detected_again() -> None:
    """Changing `image` invalidates what the old image reported."""
    changed = fleet(image="registry.example/llama-server:other")
    assert F.recorded(changed.spec, record().to_k8s()) is None
    assert "--slot-attach" not in args(pod_of(changed, F.recorded(changed.spec, record().to_k8s())),
                                       "llama-server")
    assert F.recorded(fleet().spec, record().to_k8s()) == record()
    assert F.recorded(fleet().spec, {"image": IMAGE, "known": "not a bool"}) is None


def test_auto_attach_needs_unified_kv_even_when_the_image_supports_it() -> None:
    template = pod_of(fleet(kvUnified=False), record())
    assert "--slot-attach" not in args(template, "llama-server")
    assert "--cache-prefix" in args(template, "llama-server")


def test_on_and_off_ignore_detection_and_render_no_detector_when_nothing_is_auto() -> None:
    on = pod_of(fleet(prefixSharing={"attach": "on", "cachePrefix": "on"}), None)
    assert {"--slot-attach", "--cache-prefix"} <= set(args(on, "llama-server"))
    off = pod_of(fleet(prefixSharing={"attach": "off", "cachePrefix": "off"}), record())
    assert not {"--slot-attach", "--cache-prefix"} & set(args(off, "llama-server"))
    for template in (on, off):
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["fetch-model"]
        assert "--server-help-file" not in args(template, "agent")


def test_detector_runs_the_fleet_image_and_the_agent_reads_what_it_writes() -> None:
    f = fleet(prefixSharing={"serverBinary": "/usr/local/bin/llama-server"})
    template = pod_of(f, None)
    detector = template["spec"]["initContainers"][-1]
    assert detector["name"] == F.DETECTOR and detector["image"] == IMAGE
    assert detector["command"][-2:] == ["/usr/local/bin/llama-server", podspec.SERVER_HELP_FILE]
    agent = args(template, "agent")
    assert agent[agent.index("--server-help-file") + 1] == podspec.SERVER_HELP_FILE
    # Both see the file: the detector's /tmp is the same emptyDir the agent mounts at /tmp.
    agent_mounts = next(c for c in template["spec"]["containers"] if c["name"] == "agent")["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in detector["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in agent_mounts
    assert podspec.SERVER_HELP_FILE.startswith("/tmp/")
    for obj in render_all(f, Target.of(f)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def run_detector(detector: dict[str, Any], binary: str, out: Path, path_env: str) -> int:
    """The detector's exact command, with the binary and the output file swapped for local ones."""
    command = [*detector["command"][:-2], binary, str(out)]
    return subprocess.run(command, env={"PATH": path_env}, timeout=60, check=False).returncode


@pytest.mark.llama
def test_detector_command_writes_the_help_the_agent_parses_and_never_fails(
        tmp_path: Path, llama_server_bin: Path) -> None:
    """Run as rendered (with `sh`): the real binary's help lands in the file; a wrong binary path falls
    back to `llama-server` on the PATH; no binary at all still exits 0, leaving an explanation."""
    detector = pod_of(fleet(), None)["spec"]["initContainers"][-1]
    system_path = os.environ.get("PATH", "/usr/bin:/bin")
    out = tmp_path / "a" / "help.txt"
    assert run_detector(detector, str(llama_server_bin), out, system_path) == 0
    assert parse_help(out.read_text()) is not None
    fallback = tmp_path / "b" / "help.txt"
    on_path = f"{llama_server_bin.parent}:{system_path}"
    assert run_detector(detector, "/app/llama-server", fallback, on_path) == 0
    assert parse_help(fallback.read_text()) is not None
    missing = tmp_path / "c" / "help.txt"
    assert run_detector(detector, "/app/llama-server", missing, "/usr/bin:/bin") == 0
    assert parse_help(missing.read_text()) is None and "not found" in missing.read_text()


def running_pod(name: str, image: str, *, detector: bool = True, ready: bool = True,
                server_args: tuple[str, ...] = ()) -> dict[str, Any]:
    inits = [{"name": F.DETECTOR}] if detector else []
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"initContainers": inits,
                     "containers": [{"name": "llama-server", "image": image, "args": list(server_args)},
                                    {"name": "agent", "ports": [{"name": "agent", "containerPort": 9}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_only_running_pods_of_the_current_image_and_model_with_a_detector_are_asked() -> None:
    """Not a pod of the previous model either, while a rollout replaces it: its agent reads that
    model's window."""
    spec = fleet().spec
    pods = [running_pod("old", "registry.example/llama-server:old"), running_pod("no-detector", IMAGE,
            detector=False), running_pod("starting", IMAGE, ready=False), running_pod("ready", IMAGE),
            running_pod("old-model", IMAGE, server_args=("-m", "/models/other.gguf")),
            running_pod("this-model", IMAGE, server_args=("-m", podspec.model_path(spec)))]
    assert [P.name(p) for p in F.candidates(pods, spec)] == ["ready", "this-model", "starting"]


def test_a_model_with_a_sliding_window_gets_no_attach_and_keeps_per_slot_streams() -> None:
    """llama-server attaches no slot of a sliding-window model: with kvUnified unset the pods keep
    per-slot streams, and the image's other flags stay on. The window is known with the image's flags
    (one agent answer), so such a fleet never rolls out a unified pool."""
    spec_fleet = fleet(kvUnified=None)
    key = F.model_key(spec_fleet.spec)
    plain = pod_of(spec_fleet, record(model=key))
    assert "--slot-attach" in args(plain, "llama-server") and "-kvu" in args(plain, "llama-server")
    windowed = pod_of(spec_fleet, record(model=key, sliding_window=512))
    server = args(windowed, "llama-server")
    assert "--slot-attach" not in server and "-no-kvu" in server and "--cache-prefix" in server
    assert "--attach" not in args(windowed, "agent")
    status = fleet_status(spec_fleet, [], None, record(model=key, sliding_window=512))
    assert status["attach"] is False and status["imageFeatures"]["slidingWindow"] == 512


def test_the_window_of_another_model_is_dropped_and_asked_again_the_image_flags_stay() -> None:
    f = fleet()
    old = record(model="old.gguf#000000000000", sliding_window=512)
    kept = F.recorded(f.spec, old.to_k8s())
    assert kept is not None and kept.sliding_window is None and kept.slot_attach
    assert F.model_unknown(f.spec, kept)
    current = record(model=F.model_key(f.spec), sliding_window=512)
    assert F.recorded(f.spec, current.to_k8s()) == current and not F.model_unknown(f.spec, current)
    # another URL under the same file name is another model
    moved = fleet(model={"name": "m", "file": "m.gguf", "source": {"url": "https://models.example/v2/m.gguf"}})
    assert F.model_key(moved.spec) != F.model_key(f.spec)


@pytest.mark.parametrize(("features", "known", "attach"), [
    ({"known": True, "slotAttach": True, "cachePrefix": False}, True, True),
    ({"known": False, "slotAttach": True, "message": "not llama-server help: sh: not found"}, False, False),
    (None, False, False),  # an agent without a help file
])
def test_agent_answer_becomes_a_record_for_the_image(
        features: dict[str, Any] | None, known: bool, attach: bool) -> None:
    rec = F.from_info(IMAGE, "p-0", {"pod": "p-0", "features": features})
    assert (rec.image, rec.known, rec.slot_attach, rec.pod) == (IMAGE, known, attach, "p-0")
    assert rec.detected_at and (known or rec.message)
    assert F.same(rec, rec.model_copy(update={"detected_at": "2001-01-01T00:00:00Z"}))


@pytest.mark.parametrize(("window", "expected"), [(512, 512), (None, None), (0, None), (-4, None),
                                                  (True, None), ("512", None)])
def test_the_agents_window_is_recorded_for_the_model_it_was_asked_about(window: Any, expected: Any) -> None:
    rec = F.from_info(IMAGE, "p-0", {"features": {"known": True, "slotAttach": True},
                                     "slidingWindow": window}, "m.gguf#abc")
    assert (rec.model, rec.sliding_window) == ("m.gguf#abc", expected)
    assert F.support(rec)["attach_supported"] is (expected is None)


def test_member_patched_flags_are_the_pods_own_args_not_the_fleets() -> None:
    """During the rollout that turns attach on, only pods started from the new template have it."""
    old = running_pod("a", IMAGE)
    new = running_pod("b", IMAGE, server_args=("-m", "x", "--slot-attach", "--cache-prefix"))
    for pod, expected in ((old, (False, False)), (new, (True, True))):
        found = P.member(pod, model="m", slots=2, warm=())
        assert (found.attach, found.cache_prefix) == expected


def test_status_records_the_features_and_the_resolved_flags() -> None:
    f = fleet()
    status = fleet_status(f, [], None, record(cache_prefix=False))
    assert status["attach"] is True and status["cachePrefix"] is False
    assert status["imageFeatures"]["image"] == IMAGE and status["imageFeatures"]["slotAttach"] is True
    unknown = fleet_status(f, [], None, None)
    assert unknown["attach"] is False and unknown["imageFeatures"] is None

"""The operator's pods for a patched image, run on the real patched llama-server.

What the operator renders once an image's agent reported `--slot-attach` and `--cache-prefix`
(`prefixSharing: auto`, kvUnified unset, the head's size given): the llama-server container's exact args
(paths and port swapped for local ones, as the test kubelet does) start the real patched binary, whose
pool is the head once plus every slot's own context, and a real client's sessions on two slots share the
head: the second attaches the first's cells, and the server keeps the head as a RAM prefix entry. The
agent container's args are read by the agent's own parser, with the same KV layout.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llamafleet_agent.cli import parse_settings
from llamafleet_core.crd.models import LlamaFleet
from llamafleet_local.redis_server import free_port
from llamafleet_operator.render import Target
from llamafleet_operator.render.pod import pod_template
from tests.fixtures.llama import TinyModels
from tests.operator.kubelet import RenderedServer, local_args
from tests.operator.operator_bed import fleet_manifest
from tests.patched import attach_bed as bed

pytestmark = [pytest.mark.llama]

SLOTS, CONTEXT, HEAD = 2, 16_384, 14_000


def _containers(template: dict[str, object]) -> dict[str, dict[str, object]]:
    spec = template["spec"]
    assert isinstance(spec, dict)
    return {c["name"]: c for c in spec["containers"]}


def test_the_rendered_pod_of_a_patched_image_runs_on_the_patched_binary_and_shares_the_head(
    tmp_path: Path, patched_llama_server_bin: Path, tiny_models: TinyModels
) -> None:
    fleet = LlamaFleet.model_validate(fleet_manifest(
        slots=SLOTS, contextPerSlot=CONTEXT, threads=1, prefixSharing={"headTokens": HEAD}))
    target = Target.of(fleet, attach_supported=True, cache_prefix_supported=True)
    containers = _containers(pod_template(fleet, target))
    rendered = list(containers["llama-server"]["args"])  # type: ignore[call-overload]
    assert {"--slot-attach", "--cache-prefix", "-kvu"} <= set(rendered)
    # the pool: the head once, plus what each slot holds besides it
    assert rendered[rendered.index("-c") + 1] == str(HEAD + SLOTS * (CONTEXT - HEAD))
    agent = parse_settings(list(containers["agent"]["args"]))  # type: ignore[call-overload]
    assert agent.kv_unified is True and agent.attach is True

    port = free_port()
    server = RenderedServer(binary=patched_llama_server_bin, model=tiny_models.dense_sharp,
                            workdir=tmp_path / "pod", port=port)
    server.argv = local_args(rendered, model=tiny_models.dense_sharp, port=port, snapdir=tmp_path / "snaps")
    (tmp_path / "snaps").mkdir()
    server.start()
    try:
        props = httpx.get(server.url + "/props", timeout=30.0).json()
        assert props["total_slots"] == SLOTS
        assert props["default_generation_settings"]["n_ctx"] == CONTEXT  # a slot may still hold all
        first = bed.chat(server.url, bed.body("Session A: list the changed files.", max_tokens=2, slot=0))
        second = bed.chat(server.url, bed.body("Session B: run the tests.", max_tokens=2, slot=1))
        head = first["timings"]["prefix_entry_n"]
        assert head > 10_000, first["timings"]
        assert second["timings"]["attached_n"] >= head - 16, second["timings"]
        assert second["timings"]["prefix_entry_n"] == head
        cells = bed.metrics(server.url)
        assert cells["prompt_cache_prefix_entries"] == 1, cells
    finally:
        server.stop()

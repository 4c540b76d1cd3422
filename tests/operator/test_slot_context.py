"""What the pods' servers really do, read back into the fleet's status: the context each slot has, and
whether a restored slot is resumed from (the agents' restore probe).

llama-server caps a slot at the model's training context without failing; the operator reports what its
pods' servers say (`status.slotContext`) and a `ContextCapped` condition, with an event, when that is
below `contextPerSlot`. The end-to-end test runs the rendered pod on the real llama-server (the test
kubelet) with a tiny model trained on 65,536 tokens and asks for more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamafleet_core.crd.models import LlamaFleet
from llamafleet_operator.reconcile.fleet import fleet_status
from llamafleet_operator.reconcile.restores import probed, restores_condition
from llamafleet_operator.reconcile.slot_context import capped_condition, smallest
from llamafleet_operator.settings import OperatorSettings
from llamafleet_testbed.real_models import ensure_real_model
from tests.operator.kubelet import operated_node, tiny_dense_fleet
from tests.operator.operator_bed import (
    FLEETS,
    NS,
    create,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
)
from tests.operator.test_fleet_conditions import condition_of, events

TOKEN = "slot-context-token"
TRAINED = 65_536  # the tiny models' context_length (tinymodel_recipes.py)


def _fleet(**spec: Any) -> LlamaFleet:
    return LlamaFleet.model_validate({k: v for k, v in fleet_manifest(**spec).items() if k != "apiVersion"})


def test_the_smallest_reported_context_counts_and_nonsense_is_ignored() -> None:
    assert smallest([{"slotContext": 8192}, {"slotContext": 4096}, {"slotContext": None}]) == 4096
    assert smallest([{}, {"slotContext": "8192"}, {"slotContext": True}, {"slotContext": 0}]) is None


def test_capped_only_below_the_requested_context() -> None:
    spec = _fleet(contextPerSlot=24_576).spec
    capped = capped_condition(spec, 8192)
    assert capped is not None and (capped["status"], capped["reason"]) == ("True", "SlotContextCapped")
    assert "8192" in capped["message"] and "24576" in capped["message"]
    fine = capped_condition(spec, 24_576)
    assert fine is not None and (fine["status"], fine["reason"]) == ("False", "AsRequested")
    assert capped_condition(spec, None) is None


def test_status_keeps_the_last_record_when_no_pod_answered() -> None:
    fleet = _fleet(contextPerSlot=24_576)
    first = fleet_status(fleet, [], None, slot_context=8192)
    assert first["slotContext"] == 8192
    again = fleet_status(fleet, [], first, slot_context=None)
    assert again["slotContext"] == 8192
    assert {c["type"]: c["status"] for c in again["conditions"]}["ContextCapped"] == "True"
    assert "ContextCapped" not in {c["type"] for c in fleet_status(fleet, [], None)["conditions"]}


@pytest.mark.llama
async def test_a_slot_the_server_capped_is_in_the_status_and_an_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path, tiny_models: Any) -> None:
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS], agent_token=TOKEN,
                                    reconcile_interval_s=0.5, prefix_interval_s=5.0,
                                    allowed_host_paths=[str(tiny_models.dense.parent)])
        async with operated_node(api, settings, binary=llama_server_bin, model=tiny_models.dense,
                                 workdir=tmp_path / "node", token=TOKEN) as node:
            await create(api, tiny_dense_fleet(tiny_models.dense, slots=1, contextPerSlot=2 * TRAINED))
            capped = await eventually(lambda: (c := condition_of(api, "tiny", "ContextCapped"))
                                      and c["status"] == "True" and c, 90, "ContextCapped")
            assert capped["reason"] == "SlotContextCapped" and str(TRAINED) in capped["message"]
            status = (obj(api, FLEETS, "tiny") or {}).get("status") or {}
            assert status["slotContext"] == TRAINED
            # kopf posts events from a queue of its own, after the status patch: wait for the event itself.
            assert await eventually(lambda: any(str(TRAINED) in m for m in events(api, "tiny")), 30,
                                    "an event naming the capped context")
            assert not node.errors



def test_one_pod_finding_restores_unused_turns_them_off_for_the_fleet() -> None:
    off = {"restores": {"state": "unusable", "reason": "reused 0 of 576 tokens"}}
    on = {"restores": {"state": "reusable", "reason": "no sliding window"}}
    assert probed([on, off]) == ("unusable", "reused 0 of 576 tokens")
    assert probed([on, {"restores": {"state": "pending"}}]) == ("reusable", "no sliding window")
    assert probed([{}, {"restores": "unusable"}, {"restores": {"state": "pending"}}]) is None
    cond = restores_condition("unusable", "reused 0 of 576 tokens")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "NotReusedByServer")
    assert "reused 0 of 576 tokens" in cond["message"] and "Slot locality" in cond["message"]
    fine = restores_condition("reusable", "no sliding window")
    assert fine is not None and fine["status"] == "False"
    fleet = _fleet()
    first = fleet_status(fleet, [], None, restores=("unusable", "reused 0"))
    assert first["restores"] == "unusable"
    again = fleet_status(fleet, [], first)  # no pod answered: the record and the condition stay
    assert again["restores"] == "unusable"
    assert {c["type"]: c["status"] for c in again["conditions"]}["RestoresOff"] == "True"


@pytest.mark.llama
async def test_a_sliding_window_fleet_says_its_restores_are_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path) -> None:
    """Gemma 3 on upstream llama-server: the pod's agent probes a restore at start, and the fleet's
    status and an event say restores are off, with the server's own count."""
    gemma = ensure_real_model("gemma3-270m")
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(kubeconfig=kubeconfig, namespaces=[NS], agent_token=TOKEN,
                                    reconcile_interval_s=0.5, prefix_interval_s=5.0,
                                    allowed_host_paths=[str(gemma.parent)])
        async with operated_node(api, settings, binary=llama_server_bin, model=gemma,
                                 workdir=tmp_path / "node", token=TOKEN) as node:
            manifest = tiny_dense_fleet(gemma, slots=1, contextPerSlot=4096)
            manifest["spec"]["model"] = {"name": "gemma", "file": gemma.name,
                                         "source": {"hostPath": str(gemma.parent)}}
            await create(api, manifest)
            off = await eventually(lambda: (c := condition_of(api, "tiny", "RestoresOff"))
                                   and c["status"] == "True" and c, 120, "RestoresOff")
            assert off["reason"] == "NotReusedByServer" and "sliding window of 512" in off["message"]
            assert ((obj(api, FLEETS, "tiny") or {}).get("status") or {})["restores"] == "unusable"
            assert await eventually(lambda: any("sliding window" in m for m in events(api, "tiny")), 30,
                                    "an event naming the sliding window")  # queued by kopf, as above
            assert not node.errors

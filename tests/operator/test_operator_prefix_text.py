"""A 32K-token SharedPrefix under client-side `kubectl apply`, and prefix text referenced from a ConfigMap.

The emulator refuses annotations over the API server's 256 KiB (kmock_support.py). kubectl keeps the
whole applied manifest in `last-applied-configuration`; kopf kept the whole spec again in its last
handled configuration, so two copies of 130 KB of text did not fit and kopf could never record that it
had handled the object. No pods run here: the prefix's fleet is absent, so each reconcile stops at
`FleetNotFound` after the spec and its text have been read (the llama tests warm real pods).
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import kopf
import pytest

from llamafleet_core.crd.models import SharedPrefixSpec
from llamafleet_operator.handlers.diffbase import DigestedDiffBaseStorage
from llamafleet_operator.reconcile.prefix_text import prefix_source, revision
from llamafleet_operator.settings import OperatorSettings
from tests.operator.kubelet import operated_node, tiny_dense_fleet
from tests.operator.operator_bed import (
    FLEETS,
    NS,
    PREFIXES,
    create,
    emulated_api,
    eventually,
    fleet_manifest,
    obj,
    running_operator,
)

KUBECTL = "kubectl.kubernetes.io/last-applied-configuration"
DIFFBASE = "kopf.llamafleet.io/last-handled-configuration"
OPERATOR_ANNOTATION_MAX = 16 * 1024
CONFIG_MAPS = "/api/v1/namespaces/llm/configmaps"
TOKEN = "operator-test-token"
CONTEXT = 40960  # one slot of the tiny model (trained on 64K) holds the whole prefix
MIN_TOKENS = 31_000  # `long_prompt()` under the tiny models' Qwen tokenizer is 32.1K


SUBJECTS = ("the gateway", "a pod", "the operator", "each agent", "the router", "a session", "the fleet",
            "every slot")
VERBS = ("keeps", "routes", "restores", "measures", "reports", "checks", "pulls", "warms")
OBJECTS = ("the shared prefix", "its snapshot", "the cached tokens", "a cold request", "the block chain",
           "the longest match", "the idle slot", "the prompt cache")
TAILS = ("before the first user message", "when the pod turns ready", "after a restart", "under load",
         "within its byte budget", "for every tenant", "without a second prefill", "at the next tick")


def long_prompt(n_bytes: int = 134_000, seed: int = 0) -> str:
    """About 32K tokens of system prompt (32.1K under the tiny models' Qwen tokenizer, 4.2 bytes a token,
    like English prose): numbered rules of random phrases, no block repeated."""
    rnd = random.Random(seed)
    lines, size, i = [], 0, 0
    while size < n_bytes:
        first, second = (f"{rnd.choice(SUBJECTS)} {rnd.choice(VERBS)} {rnd.choice(OBJECTS)}" for _ in "12")
        line = f"Rule {i}: {first} {rnd.choice(TAILS)}, and {second}.\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)


def settings(kubeconfig: str, **overrides: Any) -> OperatorSettings:
    values: dict[str, Any] = {"kubeconfig": kubeconfig, "namespaces": [NS], "reconcile_interval_s": 3600.0,
                              "prefix_interval_s": 3600.0, "agent_token_secret": "agent-token"}
    return OperatorSettings(**{**values, **overrides})


def prefix_manifest(fleet: str = "absent", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix",
            "metadata": {"name": "big", "namespace": NS}, "spec": {"fleetRef": {"name": fleet}, **spec}}


def client_side_applied(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as `kubectl apply` (client-side) sends it: with itself in an annotation."""
    out = json.loads(json.dumps(manifest))
    out["metadata"]["annotations"] = {KUBECTL: json.dumps(manifest, separators=(",", ":")) + "\n"}
    return out


def status(api: Any) -> dict[str, Any]:
    return dict((obj(api, PREFIXES, "big") or {}).get("status") or {})


def ready(api: Any) -> dict[str, Any]:
    return next((c for c in status(api).get("conditions") or [] if c["type"] == "Ready"), {})


def reason(api: Any) -> str:
    return str(ready(api).get("reason", ""))


def ready_message(api: Any) -> str:
    return str(ready(api).get("message", ""))


def handled(api: Any, generation: int) -> dict[str, str] | None:
    """The annotations once kopf has recorded handling `generation` (and the status says it too)."""
    body = obj(api, PREFIXES, "big") or {}
    annotations = dict((body.get("metadata") or {}).get("annotations") or {})
    done = (DIFFBASE in annotations and status(api).get("observedGeneration") == generation
            and body["metadata"]["generation"] == generation)
    return annotations if done else None


async def put_prompts(api: Any, data: dict[str, str], new: bool = False) -> None:
    """Create the `prompts` ConfigMap, or merge `data` into it."""
    if new:
        resp = await api.post(CONFIG_MAPS, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "prompts"}, "data": data})
    else:
        resp = await api.patch(f"{CONFIG_MAPS}/prompts", json={"data": data},
                               headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status in (200, 201), await resp.text()


def warm(api: Any, other_than: str | None = None) -> dict[str, Any]:
    """The status once Warm (with a hash other than `other_than`); else raises with the status seen."""
    st = status(api)
    assert st.get("phase") == "Warm" and st.get("hash") != other_than, st
    return st


def fleet_ready(api: Any) -> bool:
    return bool(((obj(api, FLEETS, "tiny") or {}).get("status") or {}).get("ready") == "1/1")


def operator_annotations(annotations: dict[str, str]) -> dict[str, int]:
    return {k: len(k) + len(v.encode()) for k, v in annotations.items() if k != KUBECTL}


async def test_32k_token_prefix_applied_client_side_keeps_its_text_out_of_the_operators_annotations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf records a handled 130 KB inline prefix; no annotation of the operator's exceeds 16 KiB; an
    edit of the text alone is still seen as a change (the update handler runs for the new generation)."""
    text = long_prompt()
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig)):
            await create(api, client_side_applied(prefix_manifest(text=text)))
            annotations = await eventually(lambda: handled(api, 1), 20, "kopf's diff base recorded")
            assert reason(api) == "FleetNotFound"
            sizes = operator_annotations(annotations)
            assert max(sizes.values()) <= OPERATOR_ANNOTATION_MAX, sizes
            assert text[:80] not in annotations[DIFFBASE]  # one line: no newline that JSON would escape

            edited = prefix_manifest(text=text + "Rule last: be terse.\n")
            resp = await api.patch(f"/apis/llamafleet.io/v1alpha1/namespaces/{NS}/sharedprefixes/big",
                                   json=client_side_applied(edited),
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert resp.status == 200, await resp.text()
            annotations = await eventually(lambda: handled(api, 2), 20, "the text edit handled")
            assert max(operator_annotations(annotations).values()) <= OPERATOR_ANNOTATION_MAX


async def test_prefix_text_from_a_config_map_is_read_and_waits_for_a_missing_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing ConfigMap, then a missing key, is a Pending prefix that names it; once the key exists the
    timer reads it and the reconcile goes on (to the absent fleet). Nothing the operator writes carries
    the text: kubectl's copy of the spec holds the reference only."""
    text = long_prompt()
    ref = {"configMapKeyRef": {"name": "prompts", "key": "agent.txt"}}
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        async with running_operator(settings(kubeconfig, prefix_interval_s=0.3)):
            await create(api, client_side_applied(prefix_manifest(textFrom=ref)))
            await eventually(lambda: reason(api) == "ConfigMapNotFound", 20, "ConfigMapNotFound")
            assert status(api)["phase"] == "Pending"
            assert "ConfigMap 'prompts' in llm not found" in ready_message(api)

            await put_prompts(api, {"other.txt": "x"}, new=True)
            await eventually(lambda: reason(api) == "ConfigMapKeyNotFound", 20, "ConfigMapKeyNotFound")
            assert "no key 'agent.txt'" in ready_message(api) and "other.txt" in ready_message(api)

            await put_prompts(api, {"agent.txt": text})
            await eventually(lambda: reason(api) == "FleetNotFound", 20, "the text read, on to the fleet")
            body = obj(api, PREFIXES, "big") or {}
            annotations = body["metadata"]["annotations"]
            assert all(len(v) <= OPERATOR_ANNOTATION_MAX for v in annotations.values())
            assert text[:80] not in json.dumps(body)


@pytest.mark.llama
@pytest.mark.redis
@pytest.mark.slow
async def test_32k_token_prefix_from_a_config_map_warms_real_pods_and_rewarms_when_the_config_map_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path, tiny_models: Any,
        redis_url: str) -> None:
    """The operator tokenizes the ConfigMap's 130 KB text (about 32K tokens), warms it on a real pod,
    and, once the ConfigMap is edited, warms the new text as a new snapshot and removes the old one;
    nothing it writes on the SharedPrefix carries the text."""
    text = long_prompt()
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        ours = settings(kubeconfig, redis_url=redis_url, index_prefix=f"t{uuid.uuid4().hex[:8]}",
                        agent_token=TOKEN, agent_token_secret=None, reconcile_interval_s=0.5,
                        prefix_interval_s=0.5, allowed_host_paths=[str(tiny_models.dense.parent)])
        async with operated_node(api, ours, binary=llama_server_bin, model=tiny_models.dense,
                                 workdir=tmp_path / "node", token=TOKEN) as node:
            await put_prompts(api, {"agent.txt": text}, new=True)
            await create(api, tiny_dense_fleet(tiny_models.dense, slots=1, contextPerSlot=CONTEXT))
            await eventually(lambda: fleet_ready(api), 90, "the pod Ready")

            ref = {"configMapKeyRef": {"name": "prompts", "key": "agent.txt"}}
            await create(api, client_side_applied(prefix_manifest("tiny", textFrom=ref)))
            st = await eventually(lambda: warm(api), 300, "warm")
            assert MIN_TOKENS <= st["tokens"] <= CONTEXT and st["warm"] == "1/1", st
            (snapshot,) = [m.name for m in await node.pods["tiny-0"].agent.list()]
            assert snapshot.endswith(st["hash"][:12])

            await put_prompts(api, {"agent.txt": text + "Be terse.\n"})
            renewed = await eventually(lambda: warm(api, other_than=st["hash"]), 300, "re-warmed")
            assert renewed["tokens"] > st["tokens"]

            async def only_new() -> list[str]:
                held = [m.name for m in await node.pods["tiny-0"].agent.list()]
                assert held and snapshot not in held, (snapshot, held, status(api))
                return held

            (kept,) = await eventually(only_new, 30, "the old snapshot removed")
            assert kept.endswith(renewed["hash"][:12])
            body = obj(api, PREFIXES, "big") or {}
            assert all(len(v) <= OPERATOR_ANNOTATION_MAX for v in body["metadata"]["annotations"].values())
            assert text[:80] not in json.dumps(body)


def test_the_diff_base_holds_digests_that_change_with_the_content_only() -> None:
    """Same content, same essence; any edit of text, messages or tools, another one; LlamaFleet specs
    and the other fields stay as they are (kopf diffs them field by field)."""
    storage = DigestedDiffBaseStorage(prefix="kopf.llamafleet.io", key="last-handled-configuration")

    def essence(**spec: Any) -> dict[str, Any]:
        return dict(storage.build(body=kopf.Body(prefix_manifest(**spec))))

    text = long_prompt()
    first = essence(text=text)
    assert first == essence(text=text) and first != essence(text=text + ".")
    assert first["spec"]["fleetRef"] == {"name": "absent"} and first["spec"]["text"].startswith("sha256:")
    assert len(json.dumps(first)) < 300
    system = [{"role": "system", "content": text}]
    assert essence(messages=system) != essence(messages=[{"role": "system", "content": text + "."}])
    fleet = fleet_manifest(replicas=3)
    assert dict(storage.build(body=kopf.Body(fleet)))["spec"] == fleet["spec"]


def test_the_revision_of_referenced_text_follows_the_text_and_the_generation() -> None:
    assert revision(3, None) == 3
    assert revision(3, "a") == revision(3, "a") != revision(3, "b")
    assert revision(3, "a") != revision(4, "a")
    spec = SharedPrefixSpec.model_validate(prefix_manifest(textFrom={
        "configMapKeyRef": {"name": "prompts", "key": "agent.txt"}})["spec"])
    source = prefix_source("big", spec, "tiny", "You are terse.")
    assert (source.name, source.model, source.text, source.messages) == ("big", "tiny", "You are terse.", ())

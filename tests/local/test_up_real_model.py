"""`up` on real models: one whose training context is smaller than the slots asked for, and one whose
restored slots upstream llama-server does not resume (a sliding window).

SmolLM2 is trained on 8K tokens; llama-server caps a larger slot there and says so only in its log.
`up` must read each pod's real slot context back, say it, put it in its status, and refuse a
SharedPrefix that cannot fit in it, naming the cap, instead of going healthy on a promise the pods do
not keep (`up/contexts.py`). Real processes (`up` in process: llama-server, agent, gateway; the index
in memory); the model is only loaded and the prefix only tokenized, so this is fast.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from llamafleet_core.warming import WarmError
from llamafleet_local.up import LocalFleet, UpOptions
from llamafleet_local.up.config import parse_documents
from llamafleet_local.up.progress import Reporter

pytestmark = [pytest.mark.llama, pytest.mark.models]

ASKED = 12288  # above SmolLM2's 8192
TRAINED = 8192


def _documents(binary: Path, prefix_words: int | None, model: str = "smollm2",
               context: int = ASKED) -> list[dict[str, Any]]:
    fleet = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet", "metadata": {"name": "s"},
        "spec": {"model": {"name": model, "file": f"{model}.gguf", "source": {"hostPath": "/models"}},
                 "image": "local", "replicas": 1, "slots": 1, "contextPerSlot": context},
        "local": {"model": model, "threads": 1, "llamaServer": str(binary)},
    }
    if prefix_words is None:
        return [fleet]
    text = " ".join(f"rule{i % 97} says keep change {i} small." for i in range(prefix_words // 6))
    prefix = {"apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix", "metadata": {"name": "long"},
              "spec": {"fleetRef": {"name": "s"}, "messages": [{"role": "system", "content": text}]}}
    return [fleet, prefix]


def _fleet(binary: Path, tmp_path: Path, log: io.StringIO, prefix_words: int | None,
           **model: Any) -> LocalFleet:
    config = parse_documents(_documents(binary, prefix_words, **model), "test fleet", tmp_path)
    options = UpOptions(port=0, index="memory", run_dir=tmp_path / "run", pod_timeout=120.0)
    return LocalFleet(config, options, Reporter(log))


async def test_up_reports_the_capped_slot_context_of_each_pod(
    llama_server_bin: Path, smollm2_model: Path, tmp_path: Path,
) -> None:
    log = io.StringIO()
    async with _fleet(llama_server_bin, tmp_path, log, None) as fleet:
        assert fleet.resolved is not None and fleet.resolved.model == smollm2_model  # by name
        assert fleet.progress.summary()["slot_context"] == {"s-0": TRAINED}
        health = (await fleet.http.get(fleet.gateway_url + "/health")).json()
        assert health["fleet"]["slot_context"] == {"s-0": TRAINED}, health
        assert health["fleet"]["restores"] == {"s-0": "reusable"}, health  # no window: not probed
    assert (f"s-0: WARNING {TRAINED} tokens per slot, not the {ASKED} of contextPerSlot (the model is "
            f"trained on {TRAINED} tokens") in log.getvalue(), log.getvalue()


async def test_a_shared_prefix_longer_than_the_capped_slot_is_an_error_naming_the_cap(
    llama_server_bin: Path, smollm2_model: Path, tmp_path: Path,
) -> None:
    """About 10K tokens: under contextPerSlot (12288), over what llama-server gives a slot (8192)."""
    log = io.StringIO()
    fleet = _fleet(llama_server_bin, tmp_path, log, 6_000)
    with pytest.raises(WarmError) as caught:
        await fleet.start()
    message = str(caught.value)
    assert caught.value.reason == "PrefixTooLong", message
    assert f"a slot holds {TRAINED}" in message and f"s-0 {TRAINED} tokens per slot" in message, message
    assert "does not help past the model's training context" in message
    assert "ERROR: the prefix is" in log.getvalue(), log.getvalue()  # the progress line shows it too
    assert not fleet.pods[0].server.running  # start() stopped what it started


async def test_up_says_restores_are_off_on_a_sliding_window_model(
    llama_server_bin: Path, tmp_path: Path,
) -> None:
    """Gemma 3 on upstream llama-server: the pod's agent probes a restore as the pod starts, and `up`
    records it and warns, with the server's own count."""
    log = io.StringIO()
    async with _fleet(llama_server_bin, tmp_path, log, None, model="gemma3-270m", context=4096) as fleet:
        assert fleet.progress.summary()["restores"] == {"s-0": "unusable"}
        await fleet.wait_ready()  # the gateway routes to the pod, having read the same from its agent
        [status] = await fleet.app.state.gateway.discovery.endpoints()
        assert status.endpoint.restores is False
        assert status.props is not None and "<start_of_turn>" in status.props.chat_template
    assert "s-0: restores off: llama-server reused 0 of" in log.getvalue(), log.getvalue()
    assert "chat template gemma3.jinja: gemma3-270m's GGUF carries none" in log.getvalue()

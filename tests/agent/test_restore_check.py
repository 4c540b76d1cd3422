"""The agent's restore probe (restore_check.py): on a real sliding-window model upstream llama-server
does not resume from a restored slot, and the agent says so before it reports ready; a model without a
window is not probed; the probe's decision and its failures, on a scripted server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamafleet_agent.restore_check import PAST_WINDOW, RestoreCheck, probe
from llamafleet_core.gguf_meta import model_sliding_window
from llamafleet_core.llama_client import LlamaError
from llamafleet_testbed.real_models import ensure_real_model
from tests.agent.conftest import TOKEN, MakePod

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.llama
async def test_a_sliding_window_model_is_probed_and_found_not_to_reuse_restores(make_pod: MakePod) -> None:
    """Gemma 3 on upstream llama-server: pending (not ready) until the probe ran, then `unusable` with
    the server's own count; the probe leaves no file and an empty slot."""
    gemma = ensure_real_model("gemma3-270m")
    assert model_sliding_window(gemma) == 512
    async with make_pod(gemma, slots=1) as pod:
        first = await pod.raw.get("/ready")
        assert first.status_code == 503 and first.json()["restores"] == "pending", first.json()
        report = await pod.app.state.restores.settled()
        assert report.state == "unusable" and report.window == 512, report
        assert "reused 0 of" in report.reason and "sliding window of 512" in report.reason
        ready = await pod.raw.get("/ready")
        assert ready.status_code == 200 and ready.json()["restores"] == "unusable", ready.json()
        info = (await pod.raw.get("/v1/info", headers=AUTH)).json()
        assert info["restores"] == report.to_json()
        assert not [f for f in pod.dir.iterdir() if f.name.endswith(".bin")], "the probe left its file"
        start = await pod.llama.tokenize("line 0 of the restore probe. line 1 of the restore probe.")
        assert await pod.cache_n(start, slot=0) == 0  # the probe erased its slot


@pytest.mark.llama
async def test_a_model_without_a_window_is_not_probed(make_pod: MakePod, tiny_models: Any) -> None:
    """The tiny dense model restores where it was saved: `reusable` at once, without a probe."""
    async with make_pod(tiny_models.dense, slots=1) as pod:
        ready = (await pod.raw.get("/ready")).json()
        assert ready["restores"] == "reusable", ready
        report = pod.app.state.restores.report
        assert report.window is None and "no sliding window" in report.reason
        restores = (await pod.raw.get("/v1/info", headers=AUTH)).json()["restores"]
        assert restores["state"] == "reusable", restores


class ScriptedServer:
    """A server whose restored slot resumes `reused` tokens; `fail` raises on that action."""

    def __init__(self, reused: int, fail: tuple[str, LlamaError] | None = None) -> None:
        self.reused, self.fail, self.calls = reused, fail, []  # type: ignore[var-annotated]

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail is not None and self.fail[0] == name:
            raise self.fail[1]

    async def tokenize(self, content: str, add_special: bool = True) -> list[int]:
        return list(range(len(content.split())))

    async def prefill(self, prompt: Any, slot: int, timeout: float | None = None) -> dict[str, Any]:
        self._call("prefill")
        return {"timings": {"cache_n": self.reused if "restore" in self.calls else 0}}

    async def save_slot(self, slot: int, filename: str) -> dict[str, Any]:
        self._call("save")
        return {}

    async def restore_slot(self, slot: int, filename: str) -> dict[str, Any]:
        self._call("restore")
        return {}

    async def erase_slot(self, slot: int) -> dict[str, Any]:
        self._call("erase")
        return {}

    async def health(self) -> bool:
        return True

    async def props(self) -> dict[str, Any]:
        return {}


async def test_a_server_that_resumes_the_restored_slot_passes(tmp_path: Path) -> None:
    """As a build keeping checkpoints in its slot files would: most of the prompt reused."""
    temp = tmp_path / ".probe-x.bin"
    temp.write_bytes(b"state")
    report = await probe(ScriptedServer(reused=100 + PAST_WINDOW), 100, temp)
    assert report.state == "reusable" and not temp.exists()
    assert (await probe(ScriptedServer(reused=10), 100, temp)).state == "unusable"


async def test_a_refused_action_is_final_and_a_lost_server_is_tried_again(tmp_path: Path) -> None:
    names = iter(range(10))

    def fresh() -> Path:
        return tmp_path / f".probe-{next(names)}.bin"

    refused = ScriptedServer(0, ("save", LlamaError("no --slot-save-path", 501)))
    check = RestoreCheck(refused, 64, fresh)
    report = await check.settled()
    assert report.state == "unusable" and "refused" in report.reason
    assert refused.calls[-1] == "erase"  # the slot was left empty all the same

    lost = ScriptedServer(64 + PAST_WINDOW, ("restore", LlamaError("connection refused")))
    check = RestoreCheck(lost, 64, fresh)
    assert (await check.settled()).state == "pending"
    lost.fail = None
    assert (await check.settled()).state == "reusable"
    await check.close()

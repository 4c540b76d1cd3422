"""--slot-save-checkpoints on the real patched llama-server, with Gemma 3 270M (a sliding window of 512
tokens): a restored slot resumes from the checkpoints its file carries.

Upstream (and this build without the flag) writes only the window's last cells into a slot file and
resumes such a slot only from a context checkpoint, which a restored slot lacks: the whole prompt is
computed again. The agent's restore probe then turns restores off for the pod; with the flag it passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from llamafleet_agent.restore_check import probe
from llamafleet_core.llama_client import LlamaClient
from llamafleet_testbed.real_models import ensure_real_model
from tests.fixtures.llama import StartLlamaServer

pytestmark = pytest.mark.llama

FLAG = ("--slot-save-checkpoints", "2")
TIMEOUT = 300.0
TEXT = " ".join(f"Rule {i}: keep module_{i} under {i % 9 + 1} hundred lines." for i in range(110))
QUESTION = " Which rule covers module_7?"


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=TIMEOUT)


def _tokens(url: str, text: str, special: bool = True) -> list[int]:
    answer = _post(url, "/tokenize", {"content": text, "add_special": special}).json()
    return [int(t) for t in answer["tokens"]]


def _complete(url: str, prompt: list[int], n: int, *, cache: bool = True, probs: int = 0) -> dict[str, Any]:
    resp = _post(url, "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "id_slot": 0,
                                      "cache_prompt": cache, "return_tokens": True, "n_probs": probs})
    resp.raise_for_status()
    answer: dict[str, Any] = resp.json()
    return answer


def _top(answer: dict[str, Any]) -> list[tuple[int, float]]:
    """The first generated token's most likely candidates: (token, logprob), best first."""
    first = answer["completion_probabilities"][0]["top_logprobs"]
    return [(int(c["id"]), float(c["logprob"])) for c in first]


def _slot(url: str, action: str, filename: str | None = None) -> httpx.Response:
    return _post(url, f"/slots/0?action={action}", {"filename": filename} if filename else {})


def _saved_head(start: StartLlamaServer, folder: Path, *flags: str) -> tuple[str, list[int], Path]:
    """A server (`flags`) whose slot 0 computed the head, saved it to `head.bin` and was erased."""
    folder.mkdir(exist_ok=True)
    server = start(ensure_real_model("gemma3-270m"), slots=1, ctx=4096, slot_save_path=folder,
                   extra_args=flags)
    head = _tokens(server.url, TEXT)
    assert len(head) > 1_000, len(head)  # past the 512-token window
    _complete(server.url, head, 0)
    saved = _slot(server.url, "save", "head.bin")
    assert saved.status_code == 200, saved.text
    assert _slot(server.url, "erase").status_code == 200
    return server.url, head, folder / "head.bin"


def test_a_restored_sliding_window_slot_resumes_from_its_files_checkpoints(
    start_patched_server: StartLlamaServer, tmp_path: Path
) -> None:
    url, head, path = _saved_head(start_patched_server, tmp_path / "on", *FLAG)
    restored = _slot(url, "restore", "head.bin").json()
    assert restored["n_read"] == path.stat().st_size, restored  # the section is counted
    tail = _tokens(url, QUESTION, special=False)
    answer = _complete(url, head + tail, 1, probs=4)
    assert answer["timings"]["cache_n"] >= len(head) - 16, answer["timings"]
    cold = _complete(url, head + tail, 1, cache=False, probs=4)
    # The resumed slot computes the last tokens in a batch of its own, the cold one in the prompt's last
    # ubatch, and ggml's CPU kernels round differently by batch shape: greedy continuations may part at a
    # near tie (on an AVX-512 machine they did at the second token, two candidates 0.007 apart in
    # logprob). What a wrong state would change is the next token's distribution: the same top four,
    # each within 0.25 in logprob (0.03-0.12 apart there; a restore without the flag, 0.02-0.03).
    resumed, computed = (_top(a) for a in (answer, cold))
    assert [t for t, _ in resumed] == [t for t, _ in computed], (resumed, computed)
    apart = [abs(a - b) for (_, a), (_, b) in zip(resumed, computed, strict=True)]
    assert max(apart) <= 0.25, (resumed, computed)

    # Without the flag the same build behaves as upstream: the file restores (its section unread) and
    # the slot's whole prompt is computed again.
    plain_url, plain_head, plain_path = _saved_head(start_patched_server, tmp_path / "off")
    assert plain_head == head
    assert _slot(plain_url, "restore", "head.bin").status_code == 200
    assert _complete(plain_url, head + tail, 1)["timings"]["cache_n"] == 0
    plain_path.write_bytes(path.read_bytes())  # a flagged server's file, read by a plain one
    carried = _slot(plain_url, "restore", "head.bin")
    assert carried.status_code == 200 and carried.json()["n_read"] < path.stat().st_size, carried.text


def test_a_malformed_checkpoint_section_fails_the_restore_and_leaves_the_slot_empty(
    start_patched_server: StartLlamaServer, tmp_path: Path
) -> None:
    url, head, path = _saved_head(start_patched_server, tmp_path, *FLAG)
    good = path.read_bytes()
    for name, data in (("cut.bin", good[:-100]), ("extra.bin", good + b"\0\0\0\0")):
        (tmp_path / name).write_bytes(data)
        refused = _slot(url, "restore", name)
        assert refused.status_code == 400 and "checkpoint" in refused.text, (name, refused.text)
        assert _complete(url, head, 1)["timings"]["cache_n"] == 0, f"{name}: the slot kept a half restore"
        assert _slot(url, "erase").status_code == 200


async def test_the_agents_restore_probe_passes_with_the_flag(
    start_patched_server: StartLlamaServer, tmp_path: Path
) -> None:
    folder = tmp_path / "snapshots"
    folder.mkdir()
    server = start_patched_server(ensure_real_model("gemma3-270m"), slots=1, ctx=4096, slot_save_path=folder,
                                  extra_args=FLAG)
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        report = await probe(LlamaClient(server.url, http), 512, folder / ".probe-test.bin")
    assert report.state == "reusable", report.reason
    assert not list(folder.iterdir())

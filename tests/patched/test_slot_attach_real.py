"""--slot-attach on the real patched llama-server: sessions share one prefix's cells, never change them.

Every test drives one 4-slot server of the patched build with Hermes Agent's requests (see
attach_bed.py) on both tiny models: dense (attention only) and hybrid (gated delta net + attention,
which attaches at context checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from llamafleet_local.llama_process import LlamaServerProcess
from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.patched import attach_bed as bed

pytestmark = pytest.mark.llama

MODELS = ("dense", "hybrid")


def _server(start: StartLlamaServer, models: TinyModels, name: str, *flags: str) -> LlamaServerProcess:
    return start(getattr(models, name), slots=4, extra_args=(*bed.ATTACH_FLAGS, *flags))


@pytest.mark.parametrize("name", MODELS)
def test_three_concurrent_sessions_compute_one_prefix_and_hold_it_once(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, name: str
) -> None:
    """Three sessions sent at once: one computes the shared head, the other two wait for it and
    attach it, computing only their own suffix; the cells in use stay one head plus the suffixes."""
    server = _server(start_patched_server, tiny_models, name)
    requests = [bed.body(f"Session {i}: list the files in this folder, please.", slot=i) for i in range(3)]
    prompts = [bed.prompt_tokens(server.url, r) for r in requests]
    shared = min(bed.common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared > 10_000, "Hermes's head is about 13K tokens on the tiny vocabulary"

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda r: bed.chat(server.url, r), requests))

    attachers = 0
    for answer, prompt in zip(answers, prompts, strict=True):
        t = answer["timings"]
        if t["attached_n"] == 0:
            assert t["cache_n"] == 0 and t["prompt_n"] == len(prompt), "one session computes the head"
            continue
        attachers += 1
        assert t["attached_n"] == shared, f"the head is attached whole, not computed: {t}"
        assert t["prompt_n"] == len(prompt) - shared, "only the session's own suffix is computed"
    assert attachers == 2
    suffixes = sum(len(p) - shared for p in prompts)
    generated = sum(len(a["ids"]) for a in answers)
    used = bed.metrics(server.url)
    assert used["kv_cells_shared"] == shared
    assert used["kv_cells_used"] <= shared + suffixes + generated
    assert used["prompt_tokens_attached_total"] == 2 * shared


def _cold(url: str, request: dict) -> dict:
    """The same request computed from scratch on the same command line (no cache, hence no attach)."""
    return bed.chat(url, {**request, "cache_prompt": False})


def _filling(url: str, n_ctx_slot: int) -> dict:
    """A request on slot 0 whose prompt (the head and a long question) leaves about 200 tokens of its
    slot's context, generating until the context is full."""
    words = 1
    for _ in range(3):  # one word of the question is about one token: two corrections suffice
        request = {**bed.body("go " * words, max_tokens=n_ctx_slot, slot=0), "ignore_eos": True}
        words += n_ctx_slot - 200 - len(bed.prompt_tokens(url, request))
    return request


def _disturb(url: str, how: str, n_ctx_slot: int) -> None:
    """Slot 0 holds the head the others attached; change it the ways a session can."""
    if how == "ends":  # its session ends: a new, unrelated conversation takes the slot
        bed.chat(url, {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "id_slot": 0})
    elif how == "erased":
        bed.erase(url, 0)
    elif how == "truncated":  # the next day's prompt parts inside the head: the slot drops its tail
        bed.chat(url, bed.body("Another question.", day=1, max_tokens=4, slot=0))
    elif how == "fills":  # generation runs to the end of the slot's context
        answer = bed.chat(url, _filling(url, n_ctx_slot))
        t = answer["timings"]
        assert t["cache_n"] + t["prompt_n"] + len(answer["ids"]) >= n_ctx_slot - 2, "the context filled"


@pytest.mark.parametrize("how", ["ends", "erased", "truncated", "fills"])
@pytest.mark.parametrize("name", MODELS)
def test_what_one_slot_does_to_its_cells_leaves_the_attached_sessions_outputs_unchanged(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, name: str, how: str, tmp_path: Path
) -> None:
    """B attaches slot 0's head; slot 0 then ends, is erased, truncated or fills its context. B goes on
    with its conversation from its own cached cells: its greedy output equals a cold run's, and is
    closer to it than the same follow-up on the next day (a head that differs by its date line)."""
    ctx_slot = 16_384  # a unified cache gives each slot the whole pool unless capped
    server = start_patched_server(
        getattr(tiny_models, f"{name}_sharp"),
        slots=4,
        ctx=4 * ctx_slot,
        slot_save_path=tmp_path / "slots",
        extra_args=(*bed.ATTACH_FLAGS, "--kv-unified-per-slot", str(ctx_slot)),
    )
    bed.chat(server.url, bed.body("Session A: what is in this folder?", max_tokens=4, slot=0))
    first = bed.chat(server.url, bed.body("Session B: run the tests.", max_tokens=8, slot=1))
    assert first["timings"]["attached_n"] > 10_000

    _disturb(server.url, how, ctx_slot)

    turn = (
        {"role": "user", "content": "Session B: run the tests."},
        {"role": "assistant", "content": first["choices"][0]["message"]["content"] or ""},
    )
    follow_up = bed.body("Now explain the failures.", max_tokens=24, slot=1, history=turn)
    went_on = bed.chat(server.url, follow_up)
    assert went_on["timings"]["cache_n"] > 10_000, "the session resumed from its own cells"
    cold = _cold(server.url, follow_up)
    next_day = _cold(server.url, bed.body("Now explain the failures.", day=1, max_tokens=24, history=turn))
    assert bed.agreement(went_on["ids"], cold["ids"]) >= 0.99
    assert bed.distance(went_on, cold) < bed.distance(next_day, cold)


@pytest.mark.parametrize("name", MODELS)
def test_attached_sessions_agree_with_a_cold_run(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, name: str
) -> None:
    """Greedy outputs of sessions that attached another slot's head, against the same requests
    computed cold on the same command line, position by position (>= 99%). The check can tell: the
    next day's session (a head that differs by its date line) is further from the cold run than any
    attached session."""
    server = _server(start_patched_server, tiny_models, f"{name}_sharp")
    bed.chat(server.url, bed.body("Warm the head.", max_tokens=2, slot=0))
    attached, cold, gaps = [], [], []
    for slot in (1, 2, 3):
        request = bed.body(f"Question {slot}: which files changed?", max_tokens=32, slot=slot)
        answer = bed.chat(server.url, request)
        assert answer["timings"]["attached_n"] > 10_000
        reference = _cold(server.url, request)
        attached += answer["ids"]
        cold.append(reference)
        gaps.append(bed.distance(answer, reference))
    assert len(attached) >= 90
    assert bed.agreement(attached, [i for c in cold for i in c["ids"]]) >= 0.99
    next_day = _cold(server.url, bed.body("Question 1: which files changed?", day=1, max_tokens=32))
    assert bed.distance(next_day, cold[0]) > max(gaps)


def test_cells_a_request_computed_without_the_prompt_cache_can_still_be_attached(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    """`cache_prompt: false` only keeps a request from reusing cells; the cells it computes are plain
    and another slot attaches them (an adapter or an image would make them unshareable)."""
    server = _server(start_patched_server, tiny_models, "dense")
    bed.chat(server.url, bed.body("Computed cold.", max_tokens=2, slot=0, cache_prompt=False))
    answer = bed.chat(server.url, bed.body("Attach it.", max_tokens=2, slot=1))
    assert answer["timings"]["attached_n"] > 10_000


def _start_fails(start: Callable[..., LlamaServerProcess], model: Path, args: tuple[str, ...]) -> str:
    with pytest.raises(Exception) as failed:
        start(model, slots=2, ctx=8192, extra_args=args)
    return str(failed.value)


def test_refused_combinations_fail_at_start_with_a_clear_error(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    no_unified = _start_fails(start_patched_server, tiny_models.dense, ("--slot-attach",))
    assert "--slot-attach requires --kv-unified" in no_unified
    reuse = _start_fails(
        start_patched_server, tiny_models.dense, ("--kv-unified", "--slot-attach", "--cache-reuse", "256")
    )
    assert "--slot-attach cannot be combined with --cache-reuse" in reuse


@pytest.mark.parametrize(
    ("name", "flags", "why"),
    [
        ("dense", ("--context-shift",), "context shift moves cells"),
        ("hybrid", ("--ctx-checkpoints", "0"), "--ctx-checkpoints is 0"),
    ],
)
def test_attach_turns_itself_off_where_it_cannot_share_safely(
    start_patched_server: StartLlamaServer,
    tiny_models: TinyModels,
    name: str,
    flags: tuple[str, ...],
    why: str,
) -> None:
    """The server starts, says why attach is off, and serves requests as upstream does."""
    server = _server(start_patched_server, tiny_models, name, *flags)
    assert why in server.log_path.read_text()
    system = {"role": "system", "content": "You are a careful assistant who reads every file. " * 120}
    for slot, question in enumerate(("One?", "Two?")):
        answer = bed.chat(
            server.url,
            {
                "messages": [system, {"role": "user", "content": question}],
                "max_tokens": 2,
                "temperature": 0,
                "id_slot": slot,
            },
        )
    assert answer["timings"]["attached_n"] == 0 and answer["timings"]["cache_n"] == 0


def test_bad_input_still_gets_a_4xx_with_attach_on(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    server = _server(start_patched_server, tiny_models, "dense")
    bad_json = httpx.post(
        server.url + "/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=bed.TIMEOUT,
    )
    assert 400 <= bad_json.status_code < 500
    no_messages = httpx.post(server.url + "/v1/chat/completions", json={"messages": "x"}, timeout=bed.TIMEOUT)
    assert 400 <= no_messages.status_code < 500
    too_long = httpx.post(
        server.url + "/completion", json={"prompt": "word " * 100_000, "n_predict": 1}, timeout=bed.TIMEOUT
    )
    assert 400 <= too_long.status_code < 500

"""--cache-prefix on the real patched llama-server: the head's state kept in RAM for every later session.

Upstream's RAM prompt cache (`--cache-ram`) holds what slots lose, and loading an entry moves it out of
the cache, so it serves one session. With the flag, the state at a prompt's first user message (an
agent's tool schemas and system prompt) is saved during its prefill as an entry of its own: loading
copies it, a slot's own save never removes it, and when the cache is full the least recently used entry
leaves first. Requests are Hermes Agent's (attach_bed.py); each session is pinned to a slot, as the
gateway pins them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.fixtures.llama import LlamaServerProcess, StartLlamaServer, TinyModels
from tests.patched import attach_bed as bed

pytestmark = pytest.mark.llama

FLAGS = ("--cache-prefix", "--metrics", "--no-cache-idle-slots")


def _server(start: StartLlamaServer, models: TinyModels, name: str, *flags: str,
            cache_mib: int = 1024, slots_dir: Path | None = None) -> LlamaServerProcess:
    """Two slots; `slots_dir` turns the slot actions on (the tests empty slots with them)."""
    return start(getattr(models, name), slots=2, slot_save_path=slots_dir,
                 extra_args=(*flags, "--cache-ram", str(cache_mib)))


def _head_tokens(url: str) -> int:
    """Where two sessions' prompts part: the head (tools, system prompt) and the user turn's markup."""
    return bed.common_prefix(*(bed.prompt_tokens(url, bed.body(q)) for q in ("One?", "Two?")))


@pytest.mark.parametrize("name", ["dense_sharp", "hybrid_sharp"])
def test_every_later_session_starts_from_the_heads_entry_and_answers_as_a_cold_run(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, name: str, tmp_path: Path
) -> None:
    """The first session saves the head's entry; a session on an empty slot loads it, and so does the
    next one after that slot was emptied again (the entry was copied, not moved out), each computing
    only its question; their greedy answers equal a cold run's. Every answer says how much of its
    prompt an entry holds (`prefix_entry_n`: the head, whether saved now or kept before), even one
    whose slot reused the head from its own cells; a request without the cache says nothing of it."""
    server = _server(start_patched_server, tiny_models, name, *FLAGS, slots_dir=tmp_path / "slots")
    head = _head_tokens(server.url)
    assert head > 10_000
    first = bed.chat(server.url, bed.body("Session A: what is in this folder?", max_tokens=2, slot=0))
    assert head - 16 <= first["timings"]["prefix_entry_n"] <= head, (head, first["timings"])
    own = bed.chat(server.url, bed.body("Session A2: and in the next?", max_tokens=2, slot=0))
    assert own["timings"]["prefix_n"] == 0 and own["timings"]["cache_n"] >= head - 16, own["timings"]
    assert own["timings"]["prefix_entry_n"] == first["timings"]["prefix_entry_n"]
    uncached = bed.chat(server.url, bed.body("Session A3: again?", max_tokens=2, slot=0, cache_prompt=False))
    assert uncached["timings"]["prefix_entry_n"] == 0
    saved = bed.metrics(server.url)
    assert saved["prompt_cache_prefix_entries"] == 1 and saved["prompt_cache_prefix_bytes"] > 0, saved

    answers = []
    for session in ("B", "C"):
        bed.erase(server.url, 1)  # an empty slot: nothing of the head but the entry
        request = bed.body(f"Session {session}: run the tests.", max_tokens=24, slot=1)
        answer = bed.chat(server.url, request)
        timings = answer["timings"]
        assert head - 16 <= timings["prefix_n"] <= head, (head, timings)
        assert timings["cache_n"] == timings["prefix_n"] == timings["prefix_entry_n"], timings
        assert timings["prompt_n"] == answer["usage"]["prompt_tokens"] - timings["cache_n"]
        answers.append((request, answer))
    after = bed.metrics(server.url)
    assert after["prompt_cache_prefix_hits_total"] == 2 and after["prompt_cache_prefix_entries"] == 1, after

    for request, answer in answers:
        cold = bed.chat(server.url, {**request, "cache_prompt": False})
        assert bed.agreement(answer["ids"], cold["ids"]) >= 0.99
        assert len(answer["ids"]) >= 8


def test_without_the_flag_an_empty_slot_computes_the_head_again(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    """The same sessions on the same build without --cache-prefix: the pinned empty slot never looks at
    the RAM cache, and no prefix metric is reported."""
    server = _server(start_patched_server, tiny_models, "dense", "--metrics", "--no-cache-idle-slots")
    bed.chat(server.url, bed.body("Session A: what is in this folder?", max_tokens=2, slot=0))
    answer = bed.chat(server.url, bed.body("Session B: run the tests.", max_tokens=2, slot=1))
    assert answer["timings"]["cache_n"] < 100 and answer["timings"].get("prefix_n", 0) == 0
    assert "prompt_cache_prefix_entries" not in bed.metrics(server.url)


def test_beside_slot_attach_an_empty_slot_shares_the_head_another_slot_holds_rather_than_copy_the_entry(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path
) -> None:
    """Three slots over one pool. Session A computes the head (the entry is saved); slot 1, emptied,
    loads the entry for session B; slot 2, emptied, would load a second copy of it for session C, but
    slot 1 holds the head's cells: C attaches them, and the pool holds the head once for the three."""
    server = start_patched_server(tiny_models.dense, slots=3, slot_save_path=tmp_path / "slots", extra_args=(
        *FLAGS, "--cache-ram", "1024", "--kv-unified", "--slot-attach"))
    first = bed.chat(server.url, bed.body("Session A: what is in this folder?", max_tokens=2, slot=0))
    head = first["timings"]["prefix_entry_n"]
    bed.erase(server.url, 0)  # nothing of the head in any slot now: only the entry
    b = bed.chat(server.url, bed.body("Session B: run the tests.", max_tokens=2, slot=1))
    assert b["timings"]["prefix_n"] == head and b["timings"]["attached_n"] == 0, b["timings"]
    c = bed.chat(server.url, bed.body("Session C: fix the lint.", max_tokens=2, slot=2))
    assert c["timings"]["prefix_n"] == 0 and c["timings"]["attached_n"] >= head - 16, c["timings"]
    cells = bed.metrics(server.url)
    assert cells["kv_cells_used"] < head + 2 * 200, (cells, head)  # the head once, two questions
    assert cells["prompt_cache_prefix_hits_total"] == 1


def test_when_the_cache_is_full_the_least_recently_used_entry_leaves_first(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels, tmp_path: Path
) -> None:
    """A cache sized for two heads' entries: heads 0 and 1 are saved, head 0's is used again, then head
    2's is saved. Head 1's entry, the least recently used, leaves; head 0's, saved first, stays. The
    heads are three agents' (their first tool described differently): they part near the start, so an
    entry of one serves no other."""
    probe = _server(start_patched_server, tiny_models, "dense", *FLAGS)
    bed.chat(probe.url, bed.body("Size the entry.", max_tokens=1, slot=0))
    entry_bytes = bed.metrics(probe.url)["prompt_cache_prefix_bytes"]
    probe.stop()
    server = _server(start_patched_server, tiny_models, "dense", *FLAGS,
                     cache_mib=math.ceil(2.5 * entry_bytes / 2**20), slots_dir=tmp_path / "slots")
    assert bed.common_prefix(*(bed.prompt_tokens(server.url, _agent(k, "Hi?")) for k in (0, 1))) < 256

    def session(agent: int) -> dict:
        for slot in (0, 1):  # empty slots: no slot's save takes room in the cache
            bed.erase(server.url, slot)
        return bed.chat(server.url, {**_agent(agent, "Anything new?"), "id_slot": 0})

    for agent in (0, 1):
        assert session(agent)["timings"]["prefix_n"] == 0  # computed, and saved
    assert session(0)["timings"]["prefix_n"] > 10_000  # used again: the most recent
    assert session(2)["timings"]["prefix_n"] == 0
    assert bed.metrics(server.url)["prompt_cache_prefix_entries"] == 2
    assert session(0)["timings"]["prefix_n"] > 10_000
    assert session(1)["timings"]["prefix_n"] == 0, "agent 1's entry was the least recently used"


def _agent(k: int, question: str) -> dict:
    """Hermes's request with its first tool described as agent `k`'s: heads that part near the start."""
    request = bed.body(question, max_tokens=1)
    tools = [dict(tool) for tool in request["tools"]]
    first = dict(tools[0]["function"])
    first["description"] = f"(agent {k}) " + first.get("description", "")
    tools[0] = {**tools[0], "function": first}
    return {**request, "tools": tools}


def test_the_flag_turns_itself_off_without_the_ram_cache(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    server = _server(start_patched_server, tiny_models, "dense", "--cache-prefix", "--metrics", cache_mib=0)
    assert "--cache-prefix is off" in server.log_path.read_text()
    assert "prompt_cache_prefix_entries" not in bed.metrics(server.url)

"""--checkpoint-divergence on the real patched llama-server: a later day resumes where the days part.

A hybrid model resumes only from a context checkpoint. Hermes Agent writes the date two lines before
the end of its system prompt, so two days' prompts part there, inside the head, where upstream makes
no checkpoint: every later day computes the whole head again.
"""

from __future__ import annotations

import pytest

from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.patched import attach_bed as bed

pytestmark = pytest.mark.llama

# A first message of about 1,500 tokens (a pasted log, as agents' first messages often are): upstream's
# checkpoints near the prompt's end then fall after the date line, not before it.
QUESTION = "What changed since yesterday? The log:\n" + "".join(
    f"step {i}: compiled module_{i} in {i % 7}.{i % 10}s, 0 warnings\n" for i in range(120)
)


def _three_days(start: StartLlamaServer, models: TinyModels, *flags: str) -> tuple[list[dict], int]:
    """Day 1, 2 and 3 of one workspace on slot 0; the answers, and where day 2 and day 3 part."""
    server = start(models.hybrid, slots=2, extra_args=flags)
    try:
        days = [bed.chat(server.url, bed.body(QUESTION, day=d, max_tokens=2, slot=0)) for d in range(3)]
        parting = bed.common_prefix(
            *(bed.prompt_tokens(server.url, bed.body(QUESTION, day=d)) for d in (1, 2))
        )
    finally:
        server.stop()
    return days, parting


def test_a_later_day_resumes_from_the_checkpoint_where_the_days_part(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    days, parting = _three_days(start_patched_server, tiny_models, "--checkpoint-divergence")
    assert parting > 10_000, "the days part at the date line, near the head's end"
    day3 = days[2]["timings"]
    assert day3["cache_n"] == parting, f"day 3 resumes at the checkpoint day 2 made: {day3}"
    assert day3["prompt_n"] == days[2]["usage"]["prompt_tokens"] - parting

    upstream_days, _ = _three_days(start_patched_server, tiny_models)
    assert upstream_days[2]["timings"]["cache_n"] < parting // 2, (
        "without the flag the head is computed again"
    )
    assert days[2]["ids"] == upstream_days[2]["ids"], "resuming from the checkpoint changes no output"


def test_the_flag_turns_itself_off_on_a_model_that_needs_no_checkpoints(
    start_patched_server: StartLlamaServer, tiny_models: TinyModels
) -> None:
    server = start_patched_server(
        tiny_models.dense, slots=2, ctx=8192, extra_args=("--checkpoint-divergence",)
    )
    assert "--checkpoint-divergence is off" in server.log_path.read_text()

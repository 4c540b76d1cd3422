"""What `up` says about the context each slot really has (`up/contexts.py`, pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet_local.up.contexts import (
    capped_note,
    context_note,
    fitting_context,
    slot_context,
    trained_context,
)


@pytest.mark.parametrize(("props", "want"), [
    ({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 2}, 8192),
    ({"default_generation_settings": {"n_ctx": 0}}, None),
    ({"default_generation_settings": {"n_ctx": "8192"}}, None),
    ({"default_generation_settings": {"n_ctx": True}}, None),
    ({"default_generation_settings": None}, None),
    ({}, None),
])
def test_the_slot_context_is_read_from_props(props: dict[str, object], want: int | None) -> None:
    assert slot_context(props) == want


def test_a_capped_slot_is_a_warning_that_names_the_training_context() -> None:
    note = context_note("f-0", 24576, 8192, 8192)
    assert note == ("f-0: WARNING 8192 tokens per slot, not the 24576 of contextPerSlot (the model is "
                    "trained on 8192 tokens and llama-server caps slots there)")
    assert "llama-server gave each slot less" in context_note("f-0", 24576, 4096, 8192)
    assert context_note("f-0", 4096, 4096, 8192) == "f-0: 4096 tokens per slot"
    assert "did not report" in context_note("f-0", 4096, None, None)


def test_prefixes_are_warmed_against_the_smallest_slot_a_pod_reports() -> None:
    assert fitting_context({"a": 8192, "b": 6000}, 24576) == 6000
    assert fitting_context({"a": None, "b": 30000}, 24576) == 24576
    assert fitting_context({}, 24576) == 24576


def test_a_prefix_refused_on_capped_slots_says_raising_the_setting_does_not_help() -> None:
    note = capped_note({"f-0": 8192, "f-1": 8192}, 24576)
    assert "f-0 8192, f-1 8192 tokens per slot" in note and "does not help" in note
    assert capped_note({"f-0": 24576, "f-1": None}, 24576) == ""


def test_the_trained_context_of_a_file_that_is_not_gguf_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    assert trained_context(tmp_path / "x.gguf") is None
    assert trained_context(tmp_path / "missing.gguf") is None

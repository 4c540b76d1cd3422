"""The `llamafleet` command dispatches to each component's own entry point."""

from __future__ import annotations

import importlib

import pytest

from llamafleet_cli.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_listed_command_has_an_entry_point(command: str) -> None:
    module = importlib.import_module(COMMANDS[command][0])
    assert callable(module.main)


def test_unknown_command_is_refused_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)

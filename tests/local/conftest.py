"""Fixtures shared by the `llamafleet up` tests that run it as a subprocess."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.local.up_bed import Up


@pytest.fixture
def runs() -> Iterator[list[Up]]:
    """The `up` processes a test starts (append to it): each is stopped when the test ends."""
    started: list[Up] = []
    try:
        yield started
    finally:
        for up in started:
            up.terminate()

"""Fixtures shared by the `llamafleet up` tests that run it as a subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local.sdk_bed import sdk_fleet
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


@pytest.fixture(scope="package")
def sdk_up(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Iterator[Up]:
    """One `up` with API keys for the SDK and request-metrics tests (`sdk_bed.py`), shared by them."""
    with sdk_fleet(tmp_path_factory.mktemp("sdks"), llama_server_bin) as running:
        yield running

"""Fault scenarios over `llamafleet up`: each test gets a fresh small fleet (real llama-servers, agents,
an embedded redis-server, the gateway) in its tmp_path; the scenarios live in
`llamafleet_testbed.reliability` so that `llamafleet reliability` prints the same figures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llamafleet_testbed.reliability.bed import Bed, running_fleet


@pytest.fixture
async def bed(llama_server_bin: Path, tmp_path: Path) -> AsyncIterator[Bed]:
    async with running_fleet(llama_server_bin, tmp_path / "run") as fleet:
        yield fleet

"""The router process's own runtime tuning (the CLI's, not the app's)."""

from __future__ import annotations

import asyncio


async def test_router_freezes_its_heap_once_the_server_listens_and_not_before() -> None:
    """The CLI's start-up freeze (bench/README.md: full collections were the gateway's p99): nothing is
    frozen while the server has not started, everything alive is once it has."""
    import gc
    from types import SimpleNamespace

    from llamafleet_router.cli import freeze_heap_when_started

    threshold = gc.get_threshold()
    server = SimpleNamespace(started=False, should_exit=False)
    try:
        task = asyncio.create_task(freeze_heap_when_started(server))  # type: ignore[arg-type]
        await asyncio.sleep(0.12)
        assert gc.get_freeze_count() == 0 and not task.done()
        server.started = True
        await asyncio.wait_for(task, 2)
        assert gc.get_freeze_count() > 1000
        assert gc.get_threshold()[0] == 10_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)

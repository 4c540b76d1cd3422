"""Fake pods whose first-sight builds the test can see and hold (for the snapshot-flow security tests).

The fuzzers' fake pod (`tests.fuzz.fake_pod`) with two changes: its `/props` carries the template's
capabilities, as a real server's does, so the gateway cuts the session prefix and first sight runs; and
its `/tokenize` (the first thing a first-sight build asks) is counted and held until `released`, so each
build's flight stays open as long as the test needs, and ends (the fake's catch-all gives no tokens, the
build gives up) once it is released. Served as `url|url`: the catch-all answers the agent's `/ready`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from llamafleet_router.inprocess import serve
from tests.fixtures.templates import CAPS
from tests.fuzz.fake_pod import MODEL, SLOTS, TEMPLATE, fake_pod

PROPS = {"chat_template": TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>", "chat_template_caps": CAPS}


class HeldTokenize:
    """The pods' shared state: builds started (`asked`), and the gate that holds them (`released`)."""

    def __init__(self, *, held: bool = True) -> None:
        self.app = fake_pod([])
        self.asked = 0
        self.changed = asyncio.Event()
        self.released = asyncio.Event()
        if not held:
            self.released.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/props" and scope["method"] == "GET":
            props = {**PROPS, "model_alias": MODEL, "total_slots": SLOTS, "build_info": "fake",
                     "default_generation_settings": {"n_ctx": 4096}}
            await JSONResponse(props)(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == "/tokenize":
            self.asked += 1
            self.changed.set()
            await self.released.wait()
        await self.app(scope, receive, send)

    async def until_asked(self, count: int, timeout: float = 20.0) -> None:
        """Wait until `count` builds have started (each one wakes the wait)."""
        try:
            async with asyncio.timeout(timeout):
                while self.asked < count:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"{self.asked} first-sight builds started, {count} expected") from None


@contextlib.asynccontextmanager
async def first_sight_pods(n: int, *, held: bool = True) -> AsyncIterator[tuple[HeldTokenize, list[str]]]:
    """`n` such pods sharing one gate, and their `url|agent_url` specs."""
    state = HeldTokenize(held=held)
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve(state)) for _ in range(n)]
        try:
            yield state, [f"{u}|{u}" for u in urls]
        finally:
            state.released.set()

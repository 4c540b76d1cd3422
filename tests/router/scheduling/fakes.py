"""Hand-built endpoints and tiny in-test collaborators for the scheduling tests.

The fakes implement the scheduler's structural protocols (`PrefixIndexLike`, `SlotLeasesLike`) and
nothing more: the scheduler does not depend on how Redis behaves, only on these contracts. The real
Redis index and leases are tested against real Redis elsewhere.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from llamafleet_core.prefix.identity import PromptIdentity, RenderedBy
from llamafleet_core.types import Endpoint, Lookup, PodRef, PromptTags, SlotRef, SnapshotRef, exact_text_hash
from llamafleet_router.scheduling.framework import EndpointState, SchedRequest

MODEL = "tiny"
BLOCK_CHARS = 256


FILL = "x"  # the prompts' text: what the block hashes stand for does not matter to the scheduler


def prompt(
    model: str, blocks: tuple[str, ...], *, block_chars: int = BLOCK_CHARS, session_prefix_chars: int = 0,
    shared_chars: int = 0, rendered_by: RenderedBy = "template", head_tag: str | None = None,
    conversation_tag: str | None = None,
) -> PromptIdentity:
    """A real `PromptIdentity` with hand-made block hashes and a text of the blocks' length. Its
    `rendered_by` is a chat request's by default: the server ends a batch where its last user turn
    starts. `shared_chars`: where its shared head ends (0: nothing shared)."""
    text = FILL * (len(blocks) * block_chars)
    return PromptIdentity(model, text, blocks, block_chars, session_prefix_chars, rendered_by,
                          shared_prefix_chars=shared_chars, head_tag=head_tag,
                          conversation_tag=conversation_tag)


def text_hash(n_chars: int) -> str:
    """The exact-text hash of the first `n_chars` characters of every `prompt`: a snapshot with it is
    one the prompt extends."""
    return exact_text_hash(FILL * n_chars)


def chain(tag: str, n: int) -> tuple[str, ...]:
    """A block chain whose hashes differ between tags (stand-in for real chained hashes)."""
    return tuple(f"{tag}-{i}" for i in range(n))


def request(
    tag: str = "p",
    n_blocks: int = 10,
    *,
    session_blocks: int = 0,
    session_id: str | None = None,
    request_id: str = "r1",
    model: str = MODEL,
    shared_blocks: int | None = None,
) -> SchedRequest:
    shared = session_blocks if shared_blocks is None else shared_blocks
    identity = prompt(model, chain(tag, n_blocks), session_prefix_chars=session_blocks * BLOCK_CHARS,
                      shared_chars=shared * BLOCK_CHARS)
    return SchedRequest(request_id=request_id, model=model, prompt=identity, session_id=session_id)


def endpoint(
    name: str,
    *,
    n_slots: int = 4,
    model: str = MODEL,
    agent: bool = True,
    ready: bool = True,
    attach: bool = False,
    cache_prefix: bool = False,
    resume_anywhere: bool = True,
    restores: bool = True,
) -> Endpoint:
    return Endpoint(
        pod=PodRef(name=name, uid=f"uid-{name}", epoch=1),
        url=f"http://{name}:8080",
        model=model,
        n_slots=n_slots,
        agent_url=f"http://{name}:8081" if agent else None,
        ready=ready,
        attach=attach,
        cache_prefix=cache_prefix,
        resume_anywhere=resume_anywhere,
        restores=restores,
    )


def state(
    name: str,
    *,
    busy: tuple[int, ...] = (),
    queue: int = 0,
    in_flight: int | None = None,
    healthy: bool = True,
    last_used: dict[int, int] | None = None,
    **kw: object,
) -> EndpointState:
    ep = endpoint(name, **kw)  # type: ignore[arg-type]
    return EndpointState(
        endpoint=ep,
        busy_slots=frozenset(busy),
        queue_depth=queue,
        in_flight=len(busy) if in_flight is None else in_flight,
        healthy=healthy,
        slot_last_used=last_used or {},
    )


def slot(name: str, n: int) -> SlotRef:
    return SlotRef(f"uid-{name}", n)


def snapshot(name: str, on: str, n_blocks: int, size_bytes: int = 4_000_000) -> SnapshotRef:
    return SnapshotRef(
        name=name, pod_uid=f"uid-{on}", n_blocks=n_blocks, n_tokens=n_blocks * 64, size_bytes=size_bytes
    )


class IndexUnavailable(Exception):
    """Stand-in for llamafleet_core.index.base.IndexUnavailable."""


@dataclass
class FakeIndex:
    """Returns a fixed Lookup; `down` makes it raise like a Redis index with Redis gone."""

    result: Lookup = field(default_factory=Lookup)
    down: bool = False
    delay_s: float = 0.0
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    async def lookup(self, model: str, blocks: tuple[str, ...], tags: PromptTags | None = None) -> Lookup:
        self.calls.append((model, blocks))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            raise IndexUnavailable("redis is down")
        return self.result


@dataclass
class FakeLeases:
    """One holder per slot, shared by several schedulers like a Redis lease store would be.

    `acquire` yields to the event loop before and after checking, so concurrent schedule() calls
    really interleave at the await points the real store would have.
    """

    held: dict[SlotRef, str] = field(default_factory=dict)
    down: bool = False
    acquires: int = 0

    async def acquire(self, slot: SlotRef, holder: str, ttl_s: float) -> bool:
        self.acquires += 1
        await asyncio.sleep(0)
        if self.down:
            raise ConnectionError("redis is down")
        if slot in self.held and self.held[slot] != holder:
            return False
        self.held[slot] = holder
        await asyncio.sleep(0)
        return True

    async def release(self, slot: SlotRef, holder: str) -> None:
        await asyncio.sleep(0)
        if self.down:
            raise ConnectionError("redis is down")
        if self.held.get(slot) == holder:
            del self.held[slot]

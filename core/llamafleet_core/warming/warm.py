"""Warm a SharedPrefix on a fleet: compute it once, snapshot it, ship the snapshot to every pod.

The steps (DESIGN.md "Warm a SharedPrefix", measured.md "The mechanism by hand"):
1. render the prefix with the template from a pod's `/props` (raw text is used as is);
2. ask every pod's agent whether it already holds the snapshot (the name carries the text's hash), so a
   second warm of the same prefix computes nothing and only refreshes the index entries;
3. if nobody holds it, seed it on the first pod that manages to: tokenize there, prefill exactly those
   tokens into an idle slot with `n_predict: 0`, and have the agent save the slot (it checks the saved
   file holds exactly those tokens). The slot keeps the prefix, so it is recorded in the index too;
4. every other pod's agent pulls the file from the seed's agent, verifying checksum, token hash and
   fingerprint; a refusal fails that pod alone, with the agent's reason.

Prefill happens once per fleet: a 14K-token prefill costs seconds on a GPU, a pull of its snapshot
(a few MiB) tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from llamafleet_core.agent_client import AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.llama_client import LlamaError
from llamafleet_core.prefix import BLOCK_CHARS, ChatTemplate
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.types import exact_text_hash
from llamafleet_core.warming import steps
from llamafleet_core.warming.model import PodWarmState, PrefixSource, WarmError, WarmPod, WarmResult
from llamafleet_core.warming.render import prefix_blocks, render_prefix, snapshot_name
from llamafleet_core.warming.steps import PodClients

Progress = Callable[[PodWarmState], None]


class _Tracker:
    """Per-pod states plus the progress callback, so every change is reported exactly once."""

    def __init__(self, pods: Sequence[WarmPod], progress: Progress | None) -> None:
        self.states = [PodWarmState(p.name, "pending", message="waiting") for p in pods]
        self._progress = progress
        self._t0 = [time.perf_counter()] * len(pods)
        for state in self.states:
            self._report(state)

    def _report(self, state: PodWarmState) -> None:
        if self._progress is not None:
            self._progress(state)

    def start(self, i: int, message: str) -> None:
        self._t0[i] = time.perf_counter()
        self.step(i, message)

    def step(self, i: int, message: str) -> None:
        self.states[i].message = message
        self._report(self.states[i])

    def warm(self, i: int, manifest: SnapshotManifest, message: str) -> None:
        self._set(i, "warm", message, tokens=manifest.n_tokens, bytes=manifest.size)

    def fail(self, i: int, message: str) -> None:
        self._set(i, "failed", message)

    def _set(self, i: int, state: Any, message: str, **values: int) -> None:
        st = self.states[i]
        st.state, st.message, st.seconds = state, message, time.perf_counter() - self._t0[i]
        for key, value in values.items():
            setattr(st, key, value)
        self._report(st)


async def _render(source: PrefixSource, pcs: Sequence[PodClients]) -> str | None:
    """The prefix text, rendered with the template of the first pod that answers `/props`."""
    if source.text is not None:
        return render_prefix(source, ChatTemplate(source=""))
    for pc in pcs:
        try:
            props = await pc.llama.props()
        except LlamaError:
            continue
        return render_prefix(source, ChatTemplate.from_props(props))  # WarmError: a spec problem
    return None


async def _holding(pc: PodClients, name: str) -> SnapshotManifest | Exception | None:
    try:
        return await steps.held(pc.agent, name)
    except (AgentError, LlamaError) as exc:
        return exc


def _with_note(message: str, note: str) -> str:
    return f"{message}; {note}" if note else message


async def warm_shared_prefix(
    source: PrefixSource,
    pods: Sequence[WarmPod],
    *,
    http: httpx.AsyncClient,
    agent_token: str,
    index: PrefixIndex | None,
    block_chars: int = BLOCK_CHARS,
    pin: bool = True,
    progress: Progress | None = None,
    max_tokens: int | None = None,
    prefix_key: bytes = b"",
) -> WarmResult:
    """Make every pod of `pods` hold a verified snapshot of the prefix; report per pod.

    Raises only `WarmError`, for a spec problem: the prefix cannot be rendered, or it is `max_tokens`
    tokens or more (a slot's context: no slot could hold it and still answer). Pod trouble of any kind
    is a failed pod in the result, and never stops the others. No pod seeded: the result's `snapshot`
    is empty, so nobody records or requires a snapshot that exists nowhere. `prefix_key`: the routers'
    block-hash key (`prefix_key_bytes`), so the chain and the text hash recorded are the ones they
    look up and check.
    """
    track = _Tracker(pods, progress)
    pcs = [steps.clients(p, http, agent_token) for p in pods]
    text = await _render(source, pcs)
    if text is None:
        for i in range(len(pods)):
            track.fail(i, "no pod answered /props to render the prefix")
        return WarmResult("", 0, "", 0, 0, track.states, source.model)
    text_hash = exact_text_hash(text, prefix_key)  # the gateway's identity of it (common namespace)
    name = snapshot_name(source, text_hash)
    blocks = prefix_blocks(source, text, block_chars, prefix_key)
    result = WarmResult(name, 0, text_hash, 0, len(text), track.states, source.model, blocks)

    async def record(i: int, manifest: SnapshotManifest, slot: int | None = None) -> str:
        return await steps.register(index, source.model, pods[i], manifest, n_chars=len(text),
                                    text_hash=text_hash, slot=slot, blocks=blocks)

    holdings = await asyncio.gather(*(_holding(pc, name) for pc in pcs))
    seed: SnapshotManifest | None = None
    seed_pod: WarmPod | None = None
    for i, held in enumerate(holdings):
        if isinstance(held, Exception):
            track.fail(i, f"agent not answering: {steps.describe(held)}")
        elif held is not None:
            track.warm(i, held, _with_note("already warm", await record(i, held)))
            seed, seed_pod = seed or held, seed_pod or pods[i]

    if seed is None:
        for i, pc in enumerate(pcs):
            if track.states[i].state == "failed":
                continue
            track.start(i, "tokenizing the prefix")
            try:
                tokens = await pc.llama.tokenize(text, add_special=True)
                if max_tokens is not None and len(tokens) >= max_tokens:
                    raise WarmError(f"the prefix is {len(tokens)} tokens, and a slot holds {max_tokens}: "
                                    "no pod can build it (shorten it, or raise contextPerSlot)",
                                    reason="PrefixTooLong")
                track.step(i, f"prefilling {len(tokens)} tokens")
                manifest, slot = await steps.prefill_and_save(
                    pc, name, tokens, blocks=blocks, block_chars=block_chars, pin=pin,
                    n_chars=len(text), text_hash=text_hash,
                )
            except (AgentError, LlamaError) as exc:
                track.fail(i, f"seeding failed: {steps.describe(exc)}")
                continue
            track.warm(i, manifest, _with_note(f"seeded in slot {slot}", await record(i, manifest, slot)))
            seed, seed_pod = manifest, pods[i]
            break
    if seed is None or seed_pod is None:
        result.snapshot = ""
        return result
    result.tokens, result.bytes = seed.n_tokens, seed.size
    origin = seed_pod

    async def ship(i: int) -> None:
        track.start(i, f"pulling from {origin.name}")
        try:
            manifest = await pcs[i].agent.pull(name, source=origin.agent_url, pinned=pin)
        except AgentError as exc:
            track.fail(i, f"pod rejected snapshot: {steps.describe(exc)}")
            return
        track.warm(i, manifest, _with_note(f"pulled from {origin.name}", await record(i, manifest)))

    await asyncio.gather(*(ship(i) for i, st in enumerate(track.states) if st.state == "pending"))
    return result

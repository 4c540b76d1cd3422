"""The I/O steps warming is made of, each small enough to test and to reason about on its own.

Errors: llama-server trouble is `LlamaError`, agent trouble (including its refusals with their reasons)
is `AgentError`; the callers turn both into a failed `PodWarmState`. The index is a hint: when it is
down the pod is still warm (its agent holds the verified file), and the next warm records it again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.index.base import IndexUnavailable, PrefixIndex
from llamafleet_core.llama_client import LlamaClient, LlamaError
from llamafleet_core.snapshot import SnapshotManifest, fingerprint_mismatch
from llamafleet_core.types import SlotRef, SnapshotRef
from llamafleet_core.warming.model import WarmPod

SAVE_ATTEMPTS = 3  # a router may pin the slot we prefilled before we save it: try another idle slot


@dataclass(frozen=True)
class PodClients:
    pod: WarmPod
    llama: LlamaClient
    agent: AgentClient


def clients(pod: WarmPod, http: httpx.AsyncClient, agent_token: str) -> PodClients:
    llama = LlamaClient(pod.llama_url, http, pod.llama_api_key)
    return PodClients(pod, llama, AgentClient(pod.agent_url, http, agent_token))


def describe(exc: Exception) -> str:
    """A one-line reason for a pod's status: the agent's own words for a refusal."""
    if isinstance(exc, AgentError):
        return f"{exc.kind}: {exc.reason}" if exc.kind else exc.reason
    return str(exc) or type(exc).__name__


async def held(agent: AgentClient, name: str) -> SnapshotManifest | None:
    """The pod's manifest of `name` if it holds it AND it still fits the pod (same fingerprint).

    The fingerprint is checked again because a pod may have restarted with other settings on the same
    volume: its old file is then not warm, whatever its name says.
    """
    try:
        manifest = await agent.get(name)
    except AgentError as exc:
        if exc.status == 404:
            return None
        raise
    if fingerprint_mismatch(manifest.fingerprint, await agent.fingerprint()) is not None:
        return None
    return manifest


async def idle_slots(llama: LlamaClient) -> list[int]:
    """Slots not processing a task now, per `GET /slots` (save waits for a busy slot, so avoid them)."""
    return [int(s["id"]) for s in await llama.slots() if not s.get("is_processing")]


async def prefill_and_save(
    pc: PodClients, name: str, tokens: list[int], *, blocks: Sequence[str], block_chars: int, pin: bool,
    n_chars: int = 0, text_hash: str = "",
) -> tuple[SnapshotManifest, int]:
    """Prefill exactly `tokens` into an idle slot (`n_predict: 0`) and save it; returns (manifest, slot).

    The agent compares the saved file's tokens with `tokens`, so a request that took the slot between
    prefill and save is caught ("tokens" refusal) and another idle slot is tried.
    """
    last: Exception | None = None
    tried: set[int] = set()
    for _ in range(SAVE_ATTEMPTS):
        free = [s for s in await idle_slots(pc.llama) if s not in tried]
        if not free:
            break
        slot = free[0]
        tried.add(slot)
        await pc.llama.prefill(tokens, slot, timeout=None)
        try:
            manifest = await pc.agent.save(
                slot, name, pinned=pin, blocks=list(blocks), block_chars=block_chars, tokens=tokens,
                n_chars=n_chars, text_hash=text_hash,
            )
        except AgentError as exc:
            if exc.kind != "tokens":
                raise
            last = exc
            continue
        return manifest, slot
    raise last or LlamaError("no idle slot on this pod to prefill the prefix into")


async def register(
    index: PrefixIndex | None, model: str, pod: WarmPod, manifest: SnapshotManifest, *,
    n_chars: int, text_hash: str, slot: int | None = None, blocks: Sequence[str] = (),
) -> str:
    """Record the pod's snapshot (and the slot that holds it) in the index; returns a note or ''.

    The blocks are `blocks` (the chain under the current hash key) when given, else the manifest's,
    which travel with the file: a pod warmed later registers the same chain without rendering the
    prefix again.
    """
    if index is None:
        return ""
    chain = list(blocks) if blocks else manifest.blocks
    if not chain:
        return "not indexed: the prefix is shorter than one block"
    ref = SnapshotRef(
        name=manifest.name, pod_uid=pod.uid, n_blocks=len(chain), n_tokens=manifest.n_tokens,
        size_bytes=manifest.size, n_chars=n_chars, text_hash=text_hash,
    )
    try:
        await index.record_snapshot(model, ref, chain)
        if slot is not None:
            await index.record_slot(model, SlotRef(pod.uid, slot), chain, manifest.n_tokens)
    except IndexUnavailable as exc:
        return f"not indexed: {exc}"
    return ""


async def forget(index: PrefixIndex | None, model: str, name: str, pod: WarmPod) -> str:
    if index is None or not model:
        return ""
    try:
        await index.forget_snapshot(model, name, pod.uid)
    except IndexUnavailable as exc:
        return f"index: {exc}"
    return ""


async def delete(agent: AgentClient, name: str) -> SnapshotManifest | None:
    """Delete `name` on the pod (absent is fine); returns its manifest when there was one."""
    manifest: SnapshotManifest | None = None
    with contextlib.suppress(AgentError):
        manifest = await agent.get(name)
    try:
        await agent.delete(name)
    except AgentError as exc:
        if exc.status != 404:
            raise
    return manifest

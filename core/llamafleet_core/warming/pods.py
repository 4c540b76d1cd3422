"""Pods that start after a prefix was warmed, and removing a prefix from a fleet.

A later pod needs no prefill: any warm peer's agent serves the verified file, and the manifest that
travels with it carries the prefix's block chain, so the pod is registered in the index without
rendering the prefix again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from llamafleet_core.agent_client import AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.llama_client import LlamaError
from llamafleet_core.prefix import BLOCK_CHARS
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.warming import steps
from llamafleet_core.warming.model import PodWarmState, PrefixSource, WarmError, WarmPod, WarmResult


def _peer_order(result: WarmResult, pod: WarmPod, peers: Sequence[WarmPod]) -> list[WarmPod]:
    """Peers other than `pod`, the ones the result says are warm first (they surely hold the file)."""
    others = [p for p in peers if p.name != pod.name and p.uid != pod.uid]
    warm = {s.pod for s in result.pods if s.state == "warm"}
    return sorted(others, key=lambda p: p.name not in warm)


async def warm_pod(
    result: WarmResult,
    source: PrefixSource,
    pod: WarmPod,
    *,
    peers: Sequence[WarmPod],
    http: httpx.AsyncClient,
    agent_token: str,
    index: PrefixIndex | None,
    block_chars: int = BLOCK_CHARS,
    pin: bool = True,
) -> PodWarmState:
    """Make `pod` hold the snapshot of `result` by pulling it from a warm peer; register it.

    Peers are tried in turn (one may be gone or mid-restart); a fingerprint refusal ends the search,
    because every copy of a snapshot carries the fingerprint of the pod that saved it. `block_chars`
    is accepted for symmetry with `warm_shared_prefix`: the chain comes from the manifest.
    """
    del block_chars
    started = time.perf_counter()

    def done(state: str, message: str, tokens: int = 0, size: int = 0) -> PodWarmState:
        return PodWarmState(pod.name, "warm" if state == "warm" else "failed", tokens, size,
                            time.perf_counter() - started, message)

    if not result.snapshot:
        return done("failed", "nothing to pull: the prefix is not warm on any pod")
    target = steps.clients(pod, http, agent_token)

    async def register(manifest_message: str, manifest: SnapshotManifest) -> PodWarmState:
        note = await steps.register(index, source.model, pod, manifest, n_chars=result.n_chars,
                                    text_hash=result.text_hash, blocks=result.blocks)
        message = f"{manifest_message}; {note}" if note else manifest_message
        return done("warm", message, manifest.n_tokens, manifest.size)

    try:
        already = await steps.held(target.agent, result.snapshot)
    except (AgentError, LlamaError) as exc:
        return done("failed", f"agent not answering: {steps.describe(exc)}")
    if already is not None:
        return await register("already warm", already)
    reasons: list[str] = []
    for peer in _peer_order(result, pod, peers):
        try:
            # Pinned like the first copy: a SharedPrefix snapshot is evicted last on every pod.
            manifest = await target.agent.pull(result.snapshot, source=peer.agent_url, pinned=pin)
        except AgentError as exc:
            if exc.kind == "fingerprint":
                return done("failed", f"pod rejected snapshot: {steps.describe(exc)}")
            reasons.append(f"{peer.name}: {steps.describe(exc)}")
            continue
        return await register(f"pulled from {peer.name}", manifest)
    return done("failed", "no peer could serve the snapshot: " + ("; ".join(reasons) or "no peers"))


async def remove_shared_prefix(
    result_or_name: WarmResult | str,
    pods: Sequence[WarmPod],
    *,
    http: httpx.AsyncClient,
    agent_token: str,
    index: PrefixIndex | None,
    model: str | None = None,
) -> None:
    """Delete the snapshot on every pod's agent and forget it in the index (absent is fine).

    With a bare name, the model the index is keyed by comes from `model`, else from the manifests.
    Every pod is attempted; if any could not be cleaned, `WarmError` names them all afterwards, so a
    finalizer retries instead of dropping the resource with files left behind. Pods whose readiness
    requires this snapshot must be told first (`AgentClient.set_required`), or they turn unready.
    """
    if isinstance(result_or_name, WarmResult):
        name, model = result_or_name.snapshot, model or result_or_name.model
    else:
        name = result_or_name
    if not name:
        return

    async def clean(pod: WarmPod) -> str:
        # The index entry goes even when the agent cannot be reached: routing to a file that may be
        # gone costs a failed restore, while a file left behind costs only disk until retried.
        pc = steps.clients(pod, http, agent_token)
        problem, manifest = "", None
        try:
            manifest = await steps.delete(pc.agent, name)
        except AgentError as exc:
            problem = steps.describe(exc)
        note = await steps.forget(index, model or (manifest.model if manifest else ""), name, pod)
        reasons = "; ".join(r for r in (problem, note) if r)
        return f"{pod.name}: {reasons}" if reasons else ""

    problems = [p for p in await asyncio.gather(*(clean(pod) for pod in pods)) if p]
    if problems:
        raise WarmError(f"could not remove {name} everywhere: " + "; ".join(problems))


async def declare_required(
    pods: Sequence[WarmPod], names: Sequence[str], *, http: httpx.AsyncClient, agent_token: str
) -> dict[str, str]:
    """Tell every pod's agent the whole set of snapshots it must hold to be ready (`PUT /v1/required`).

    Level-based: always the full set of the fleet's SharedPrefix snapshots, never a delta, so a lost
    or repeated call cannot leave a pod requiring the wrong things. Returns `{pod: reason}` for the
    pods that could not be told (the caller retries them); an empty dict when all were.
    """

    async def tell(pod: WarmPod) -> tuple[str, str]:
        try:
            await steps.clients(pod, http, agent_token).agent.set_required(names)
        except AgentError as exc:
            return pod.name, steps.describe(exc)
        return pod.name, ""

    return {pod: why for pod, why in await asyncio.gather(*(tell(p) for p in pods)) if why}

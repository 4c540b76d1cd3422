"""First sight of a head: prefill it alone, in stages, saving a snapshot at each stage (`StagedPrefill`;
its single flights are flights.py).

    tokenize the head on the pod (`/tokenize` with pieces: exact char offsets per token)
    -> for each stage point k1 < k2 < ... (see `cuts.stage_points`, plus a divergence point):
         prefill tokens[:k] into the leased slot (`n_predict: 0`: the slot then holds exactly them),
         save through the agent (which checks the slot holds exactly those tokens), record in the index
    -> prefill the whole head, save it as `fs-...`, record it
    -> the caller forwards the full request pinned to the same slot, which extends it.

Each stage extends the previous one strictly, so even a hybrid model computes every token once. Saves
take milliseconds; the prefill is what a cold request would have cost anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.llama_client import LlamaClient, LlamaError
from llamafleet_core.types import Endpoint, SnapshotRef
from llamafleet_router.snapshots.base import SnapshotConfig, SnapshotMetrics, failure_kind
from llamafleet_router.snapshots.cuts import TokenEnds, snapshot_name
from llamafleet_router.snapshots.flights import Prompt, prompt_stages

log = logging.getLogger(__name__)

_PREFILL_TIMEOUT_S = 900.0  # a long prefix on a slow pod; the slot lease outlives it


# Characters per token a head is assumed to have at least before it is tokenized (costs.py's
# conservative `chars_per_token`; ~4.5 measured on agent tool JSON).
_LIKELY_CHARS_PER_TOKEN = 4.0


class HeadTooLong(Exception):
    """The head has at least as many tokens as the slot context of the pod it would be built on:
    llama-server would refuse its prefill (and the request, which is longer), so no build is tried."""

    def __init__(self, n_tokens: int, slot_context: int) -> None:
        super().__init__(f"the head's {n_tokens} tokens do not fit the slot context ({slot_context} tokens)")
        self.n_tokens = n_tokens
        self.slot_context = slot_context


def likely_fits(text: str, slot_context: int) -> bool:
    """Whether `text` is expected to fit `slot_context` tokens, before it is tokenized (0: unknown).
    Only the early first-stage prefill goes by it; the tokens decide (a wrong guess costs that stage,
    once per head: the flow remembers the heads found too long)."""
    return slot_context <= 0 or len(text) < slot_context * _LIKELY_CHARS_PER_TOKEN


def _first_cut(points: Sequence[int], extra: Sequence[int], block_chars: int, head_chars: int,
               ) -> int | None:
    """The first cut a build would save (stage points and extra cuts alike), if any."""
    return min((c for c in {*points, *extra} if block_chars <= c < head_chars), default=None)


async def tokenize_pieces(http: httpx.AsyncClient, url: str, text: str,
                          api_key: str | None = None) -> tuple[list[int], list[Any]]:
    """Token ids and pieces of `text` on the pod, with special tokens parsed (as the chat path does)."""
    body = {"content": text, "add_special": True, "parse_special": True, "with_pieces": True}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        resp = await http.post(url.rstrip("/") + "/tokenize", json=body, headers=headers, timeout=120.0)
    except httpx.HTTPError as exc:
        raise LlamaError(f"POST /tokenize: {type(exc).__name__}: {exc}") from exc
    if resp.status_code >= 400:
        raise LlamaError(f"POST /tokenize: {resp.status_code}", resp.status_code)
    items = resp.json()["tokens"]
    return [int(t["id"]) for t in items], [t.get("piece") for t in items]


class _Spent:
    """Milliseconds and counts per step of one build (tokenize, prefill, save), for its log line."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.count: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.ms[step] = self.ms.get(step, 0.0) + (time.perf_counter() - started) * 1000
            self.count[step] = self.count.get(step, 0) + 1

    def fields(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {f"{k}_ms": round(v, 1) for k, v in self.ms.items()}
        out.update({f"{k}s": v for k, v in self.count.items()})
        return out


class StagedPrefill:
    def __init__(
        self, *, http: httpx.AsyncClient, index: PrefixIndex, config: SnapshotConfig,
        metrics: SnapshotMetrics,
    ) -> None:
        self._http = http
        self._index = index
        self._config = config
        self._metrics = metrics

    async def build(
        self, prompt: Prompt, target: Endpoint, slot: int, *, start_tokens: int, extra_cuts: Sequence[int],
        known: frozenset[tuple[str, int]], on_saved: Callable[[int, SnapshotRef], None] | None = None,
        slot_context: int = 0,
    ) -> SnapshotRef | None:
        """Prefill the session prefix into `slot` in stages and snapshot it; the `fs-` snapshot or None.

        `start_tokens`: what the slot already holds of it (a restored stage snapshot), so stages at or
        before it are skipped. `known`: (text_hash, n_chars) of snapshots the index already has; they are
        not saved again. Failures are logged and counted; the slot then holds whatever was prefilled.
        `slot_context`: the pod's per-slot context (0: unknown); raises `HeadTooLong`, before any
        prefill, when the head's tokens do not fit it."""
        assert target.agent_url is not None
        spent = _Spent()
        try:
            return await self._build(prompt, target, slot, start_tokens, extra_cuts, known, on_saved, spent,
                                     slot_context)
        finally:
            # Where a first session's time goes beside the prefill a plain server would do too.
            log.info("first-sight build", extra={"pod": target.url, "slot": slot, **spent.fields()})

    async def _build(
        self, prompt: Prompt, target: Endpoint, slot: int, start_tokens: int, extra_cuts: Sequence[int],
        known: frozenset[tuple[str, int]], on_saved: Callable[[int, SnapshotRef], None] | None,
        spent: _Spent, slot_context: int = 0,
    ) -> SnapshotRef | None:
        assert target.agent_url is not None
        session = prompt.text[: prompt.head_chars]
        llama = LlamaClient(target.url, self._http, self._config.pod_api_key)
        agent = AgentClient(target.agent_url, self._http, self._config.agent_token(target.agent_url))
        points = prompt_stages(prompt, self._config)
        # A head with nothing of it in the slot: its first stage is prefilled from its text while the
        # whole head is tokenized beside it (`/tokenize` runs in the server's HTTP threads, the prefill
        # in its main loop), so the tokenize (~0.1 s at 14K tokens on the test pods) does not come first. The
        # server's own count for that text is checked against the head's tokens before the stage is
        # saved; a mismatch only costs that stage (the next prefill reuses what matches).
        ahead = _first_cut(points, extra_cuts, self._config.block_chars, prompt.head_chars)
        early = None
        # (not for a head that looks too long: its first stage would be computed for a build never made)
        if start_tokens == 0 and ahead is not None and likely_fits(session, slot_context):
            early = asyncio.ensure_future(self._prefill_text(llama, session[:ahead], slot))
        try:
            with spent("tokenize"):
                tokens, pieces = await tokenize_pieces(self._http, target.url, session,
                                                       self._config.pod_api_key)
        except (LlamaError, KeyError, ValueError, TypeError) as exc:
            self._fail("tokenize", "llama", str(exc))
            if early is not None:
                await early
            return None
        held = 0  # tokens of the head the early prefill left in the slot
        if early is not None:
            with spent("prefill"):
                held = await early
        if 0 < slot_context <= len(tokens):  # no room left for the request past its head
            raise HeadTooLong(len(tokens), slot_context)
        ends = TokenEnds.from_pieces(session, pieces)
        cuts: list[tuple[int, int]] = []  # (chars, tokens)
        if ends is None:
            points = []
        else:
            for chars in sorted({*points, *extra_cuts}):
                n = ends.tokens_at(chars)
                if n is not None and start_tokens < n < len(tokens) and chars >= self._config.block_chars:
                    cuts.append((chars, n))
        done = start_tokens
        for chars, n in cuts:
            kind = "dv" if chars in extra_cuts and chars not in points else "st"
            if (prompt.text_hash(chars), chars) in known:
                continue
            if n != held:  # (the early prefill holds exactly this stage when its count matches)
                with spent("prefill"):
                    if not await self._prefill(llama, tokens[:n], slot):
                        return None
            done = n
            with spent("save"):
                ref = await self._save(agent, prompt, target, slot, kind, chars, tokens[:n])
            if ref is not None and on_saved is not None:
                on_saved(chars, ref)  # requests waiting for this stage need not wait for the rest
        with spent("prefill"):
            if done < len(tokens) and not await self._prefill(llama, tokens, slot):
                return None
        with spent("save"):
            return await self._save(agent, prompt, target, slot, "fs", prompt.head_chars, tokens)

    async def _prefill_text(self, llama: LlamaClient, text: str, slot: int) -> int:
        """Prefill `text` (tokenized by the server, as a chat prompt is); the prompt tokens it computed,
        0 when it failed (the build goes on from the tokens)."""
        try:
            result = await llama.prefill(text, slot, timeout=_PREFILL_TIMEOUT_S)
            return int(result.get("tokens_evaluated", 0))
        except (LlamaError, ValueError, TypeError) as exc:
            self._fail("prefill", "llama", str(exc))
            return 0

    async def _prefill(self, llama: LlamaClient, tokens: list[int], slot: int) -> bool:
        try:
            await llama.prefill(tokens, slot, timeout=_PREFILL_TIMEOUT_S)
        except LlamaError as exc:
            self._fail("prefill", "llama", str(exc))
            return False
        return True

    async def _save(
        self, agent: AgentClient, prompt: Prompt, target: Endpoint, slot: int, kind: str, chars: int,
        tokens: list[int],
    ) -> SnapshotRef | None:
        text_hash = prompt.text_hash(chars)
        name = snapshot_name(kind, text_hash, chars)
        blocks = list(prompt.blocks[: chars // self._config.block_chars])
        if not blocks:
            return None
        try:
            manifest = await agent.save(slot, name, blocks=blocks, block_chars=self._config.block_chars,
                                        tokens=tokens, n_chars=chars, text_hash=text_hash)
        except AgentError as exc:
            self._fail("save", failure_kind(exc.kind, exc.status), exc.reason)
            return None
        ref = SnapshotRef(
            name=name, pod_uid=target.uid, n_blocks=len(blocks), n_tokens=manifest.n_tokens,
            size_bytes=manifest.size, last_block=blocks[-1], n_chars=chars, text_hash=text_hash,
        )
        self._metrics.saves.labels(kind).inc()
        try:
            await self._index.record_snapshot(prompt.model, ref, blocks)
        except Exception as exc:  # the file exists; a later resync records it
            self._fail("record", "index", str(exc))
        log.info("snapshot saved", extra={"snapshot": name, "kind": kind, "pod": target.url, "slot": slot,
                                          "n_tokens": manifest.n_tokens, "bytes": manifest.size})
        return ref

    def _fail(self, op: str, kind: str, reason: str) -> None:
        self._metrics.failures.labels(op, kind).inc()
        log.warning("first-sight snapshot step failed",
                    extra={"op": op, "kind": kind, "reason": reason[:300]})

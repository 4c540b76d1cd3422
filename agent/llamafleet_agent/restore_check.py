"""Whether this pod's llama-server reuses a slot it restored from a file: probed once, at start.

A restore is worth its file only if the next request resumes from it. On a model with a sliding window
(Gemma 2 and 3, Cohere 2, gpt-oss: without `--swa-full`) upstream llama-server never does: the file holds
only the window's last cells (`llama_kv_cache::state_write` skips the masked ones), the server asks for
a context checkpoint to resume from such a slot, and a restored slot has none, so it computes the whole
prompt again (measured on Gemma 3 270M: 0 of 3,017 tokens reused after a restore, 3,011 when the same
slot was extended in place). The gateway would restore anyway and then learn nothing from it.

So where the model's metadata shows a window (`gguf_meta.sliding_window`) the agent tries it once before
it reports ready: prefill a prompt longer than the window into slot 0, save, erase, restore, extend it by
a few tokens and read the server's own `cache_n`; then erase the slot and delete the file. The result
(`/ready` and `/v1/info` `restores`) turns the gateway's restores, priming and first-sight snapshots off
for this pod; slot locality still works. A patched build that keeps the slot's checkpoints in its file
passes the same probe. A model without a window restores where it was saved (attention-only and
recurrent models alike: the gateway's real-server tests cover both), so it is not probed.

Slot saves and restores the agent serves wait for the probe (`settled`), so nothing of theirs meets the
probe's slot half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llamafleet_agent.service import LlamaLike
from llamafleet_core.llama_client import LlamaError

log = logging.getLogger(__name__)

State = Literal["pending", "reusable", "unusable"]
PROBE_SLOT = 0
# Tokens past the window: the restored file must be missing cells the next request needs.
PAST_WINDOW = 64
# Of the probe prompt, the share the server must reuse after the restore.
REUSED_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class RestoreReport:
    state: State
    reason: str
    window: int | None = None  # the model's sliding window, in tokens (None: none)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "window": self.window}


def probe_text(n_tokens: int) -> str:
    """Text of at least `n_tokens` tokens in any tokenizer (each numbered word is one or more)."""
    return " ".join(f"line {i} of the restore probe." for i in range(n_tokens // 4 + 1))


async def probe(llama: LlamaLike, window: int, temp_file: Path) -> RestoreReport:
    """The round trip on `PROBE_SLOT` (module doc); LlamaError when the server failed on the way."""
    tokens = (await llama.tokenize(probe_text(window + PAST_WINDOW)))[: window + PAST_WINDOW]
    tail = await llama.tokenize(" And one more line.", add_special=False)
    try:
        await llama.prefill(tokens, PROBE_SLOT)
        await llama.save_slot(PROBE_SLOT, temp_file.name)
        await llama.erase_slot(PROBE_SLOT)
        await llama.restore_slot(PROBE_SLOT, temp_file.name)
        timings = (await llama.prefill(tokens + tail, PROBE_SLOT)).get("timings") or {}
    finally:
        with contextlib.suppress(LlamaError):
            await llama.erase_slot(PROBE_SLOT)
        await asyncio.to_thread(temp_file.unlink, missing_ok=True)
    reused = int(timings.get("cache_n", 0))
    if reused >= REUSED_SHARE * len(tokens):
        return RestoreReport("reusable", f"a restored slot resumed {reused} of {len(tokens)} tokens", window)
    return RestoreReport("unusable", f"llama-server reused {reused} of {len(tokens)} tokens of a restored "
                         f"slot (sliding window of {window} tokens: a restored slot has no context "
                         "checkpoint to resume from); restores are off on this pod", window)


class RestoreCheck:
    """The probe's one run for this agent: started on the first `start()` once llama-server answers."""

    def __init__(self, llama: LlamaLike, window: int | None, temp_file: Any) -> None:
        """`temp_file()` gives a fresh dot-name in the snapshot folder (cleaned at start when left)."""
        self._llama = llama
        self._window = window
        self._temp_file = temp_file
        self._task: asyncio.Task[RestoreReport] | None = None
        self._report: RestoreReport | None = None
        if not window:
            self._report = RestoreReport("reusable", "no sliding window: a restored slot resumes where it "
                                         "was saved")

    @property
    def report(self) -> RestoreReport:
        return self._report or RestoreReport("pending", "probing a restore round trip", self._window)

    def start(self) -> None:
        """Run the probe now unless it ran or runs (idempotent); call it once llama-server is healthy."""
        if self._report is None and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="restore probe")
            # A failed run is retried by the next start(); its exception is read here, not lost.
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def settled(self) -> RestoreReport:
        """The result once known; while llama-server is down (no probe could start) the pending one."""
        self.start()
        if self._task is not None and self._report is None:
            with contextlib.suppress(LlamaError):
                await asyncio.shield(self._task)
        return self.report

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> RestoreReport:
        assert self._window
        try:
            report = await probe(self._llama, self._window, self._temp_file())
        except LlamaError as exc:
            if exc.status is None or (exc.status >= 500 and exc.status != 501):
                log.warning("restore probe failed, trying again on the next readiness check: %s", exc)
                raise  # the server went away or stumbled: the next start() tries again
            # It refused an action outright (no --slot-save-path: 501): no restore can ever work here.
            report = RestoreReport("unusable", f"llama-server refused the probe's round trip: {exc}",
                                   self._window)
        log.info("restore probe: %s (%s)", report.state, report.reason)
        self._report = report
        return report

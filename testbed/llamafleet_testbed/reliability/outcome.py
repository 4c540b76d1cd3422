"""What one request's fate was, as the client saw it, and the per-scenario figures (pure).

A request is exactly one of:
- succeeded: status 200 and a complete answer (a stream that reached `data: [DONE]`, or a JSON body
  with `choices`);
- failed: an answer, but not a good one (a non-200 status, or a stream that ended with an SSE error
  event); the client knows at once and can retry;
- lost: no answer at all (no status before the client's deadline, a connection dropped with nothing
  said, or a stream cut without a terminal or error event). Lost requests are the ones that make a
  client hang, which is why they are counted apart from failures.

"Wrongly restored" counts answers that came from a snapshot that should never have been restored: a
damaged or mismatched one, or one whose greedy answer differs from a cold run of the same request.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SUCCEEDED, FAILED, LOST = "succeeded", "failed", "lost"
# The gateway's 502 when aiohttp wrote a request into a pooled connection the pod had already closed
# (llama-server closes idle keep-alive connections after 5 s; aiohttp keeps them for 15 s). Depending
# on the race it surfaces as a failed write or as a disconnect before the answer; the latter is also
# what a pod killed mid-request looks like, so it counts as stale only where no pod was killed.
STALE_CONNECTION = "before answering: ClientOSError"
STALE_OR_DEAD = "before answering: ServerDisconnectedError"


@dataclass
class Sent:
    """One request from the client's side, with the gateway's routing headers when there were any."""

    n: int
    started: float  # monotonic seconds
    ended: float = 0.0
    status: int | None = None
    first_byte: float | None = None  # monotonic time of the first body byte (streams)
    stream: bool = False
    terminal: bool = False  # `data: [DONE]` seen, or a complete JSON body
    error_event: bool = False  # an SSE event carrying `error`
    error: str = ""  # the client-side exception, if any
    pod: str = ""
    slot: int = -1
    action: str = ""
    snapshot: str = ""
    gateway: str = ""  # which gateway answered (several replicas)
    attempts: int = 1
    text: str = ""  # the generated text (for agreement with a cold run)
    cache_n: int = 0
    detail: str = ""  # the start of a non-200 answer's body (the gateway's error message)

    @property
    def verdict(self) -> str:
        if self.status is None:
            return LOST
        if self.status != 200 or self.error_event:
            return FAILED
        return SUCCEEDED if self.terminal else LOST

    @property
    def restored(self) -> bool:
        return bool(self.snapshot)


def parse_sse(raw: bytes) -> tuple[bool, bool, str, int]:
    """(terminal, error event, generated text, cache_n) of an SSE body relayed by the gateway."""
    terminal = error = False
    text: list[str] = []
    cache_n = 0
    for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            terminal = True
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if "error" in event:
            error = True
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            # Tiny random models "think": their text lands in reasoning_content.
            text += [v for k in ("reasoning_content", "content") if isinstance(v := delta.get(k), str)]
        timings = event.get("timings")
        if isinstance(timings, dict):
            cache_n = int(timings.get("cache_n") or 0)
    return terminal, error, "".join(text), cache_n


def parse_json(raw: bytes) -> tuple[bool, str, int]:
    """(complete, generated text, cache_n) of a non-streamed chat completion."""
    try:
        body = json.loads(raw)
    except ValueError:
        return False, "", 0
    if not isinstance(body, dict) or not body.get("choices"):
        return False, "", 0
    message = body["choices"][0].get("message") or {}
    timings = body.get("timings") or {}
    text = str(message.get("reasoning_content") or "") + str(message.get("content") or "")
    return True, text, int(timings.get("cache_n") or 0)


@dataclass
class ScenarioResult:
    """One fault scenario's figures. `checks` holds the scenario's own measurements (seconds to purge,
    degraded mode seen, ...); `problems` lists every invariant the run broke (empty: it held)."""

    scenario: str
    fault: str
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    wrongly_restored: int = 0
    stale_connection: int = 0  # 502s from an upstream keep-alive connection the pod had closed
    pods_killed: bool = False  # a llama-server died in this scenario (a disconnect may be that)
    # Where a pod is killed under streams (None elsewhere): streams the kill cut, how many of them ended
    # with an SSE error event, and seconds from the kill until the index held none of the pod's entries.
    streams_cut: int | None = None
    streams_cut_with_error_event: int | None = None
    purged_after_s: float | None = None
    seconds: float = 0.0
    checks: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, requests: list[Sent]) -> None:
        for r in requests:
            self.sent += 1
            verdict = r.verdict
            self.succeeded += verdict == SUCCEEDED
            self.failed += verdict == FAILED
            self.lost += verdict == LOST
            markers = (STALE_CONNECTION,) if self.pods_killed else (STALE_CONNECTION, STALE_OR_DEAD)
            self.stale_connection += verdict == FAILED and any(m in r.detail for m in markers)
            if verdict != SUCCEEDED and len(self.checks.setdefault("not_succeeded", [])) < 5:
                what = r.error or r.detail or ("SSE error event" if r.error_event else "no terminal event")
                # Where and for how long: a request lost in a pod's queue reads apart from a hang.
                where = f" on {r.pod}#{r.slot}" if r.pod else ""
                self.checks["not_succeeded"].append(
                    f"#{r.n} {verdict}: status {r.status}, {r.action or 'no decision'}{where}, {what}, "
                    f"{r.ended - r.started:.1f}s"[:240])

    @property
    def other_failed(self) -> int:
        """Failures with another cause than a stale upstream connection (reported on their own)."""
        return self.failed - self.stale_connection

    def finish(self) -> None:
        """Add the problems every scenario shares (called once the counts are in)."""
        self.expect(self.stale_connection == 0,
                    f"{self.stale_connection} requests failed with 502 on a reused upstream connection "
                    "that llama-server had closed (keep-alive)")

    def expect(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def agreement(got: str, want: str) -> float:
    """Share of equal leading characters between two greedy answers (1.0: identical)."""
    if not want and not got:
        return 1.0
    same = 0
    for a, b in zip(got, want, strict=False):
        if a != b:
            break
        same += 1
    return same / max(len(got), len(want))


# The table's columns: (header, the `as_dict()` fields it shows). The JSON holds every field; the
# table shows these and nothing else, so the README's figures can be traced to the JSON's.
COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("scenario", ("scenario",)), ("sent", ("sent",)), ("succeeded", ("succeeded",)),
    ("failed", ("failed",)), ("lost", ("lost",)), ("wrongly restored", ("wrongly_restored",)),
    ("streams cut / with error event", ("streams_cut", "streams_cut_with_error_event")),
    ("entries purged after s", ("purged_after_s",)), ("seconds", ("seconds",)),
    ("invariants", ("ok", "problems")),
)


def _cell(fields: tuple[str, ...], row: dict[str, Any]) -> str:
    if fields == ("ok", "problems"):
        return "held" if row["ok"] else "BROKEN: " + "; ".join(row["problems"])
    values = [row[f] for f in fields]
    if all(v is None for v in values):
        return "-"  # not measured in this scenario
    return " / ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in values)


def table(results: list[ScenarioResult]) -> str:
    """A Markdown table, one row per scenario (what the README shows), from the same `as_dict()` the
    JSON report is made of."""
    head = "| " + " | ".join(h for h, _ in COLUMNS) + " |"
    align = "|" + "|".join("---" if h in ("scenario", "invariants") else "---:" for h, _ in COLUMNS) + "|"
    rows = [head, align]
    for r in results:
        row = r.as_dict()
        rows.append("| " + " | ".join(_cell(fields, row) for _, fields in COLUMNS) + " |")
    return "\n".join(rows)


def report(results: list[ScenarioResult], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "scenarios": [r.as_dict() for r in results]}

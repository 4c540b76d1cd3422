"""Read what a response says about cache reuse, without touching the bytes the client receives.

The proxy forwards upstream chunks untouched and feeds a copy to `SSETap`, which splits lines the way the
SSE spec does (CR, LF or CRLF, a CR at a chunk's end carried over), joins `data:` lines into events and
keeps only the latest statistics, so memory stays bounded however long the stream is.

Statistics come from llama-server's `timings` (OpenAI routes; on the final chunk when streaming) or,
failing that, from `usage` (OpenAI `prompt_tokens_details.cached_tokens`, Anthropic
`cache_read_input_tokens`). `cache_n` is the server's truth about prefix reuse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

# A single SSE line longer than this is not one llama-server writes; drop it rather than buffer it.
# The same bound holds for the `data:` lines of one event together.
_MAX_LINE = 4 * 1024 * 1024
# Non-streamed answers up to this size are parsed whole; larger ones only at their statistics' keys,
# whose values are read from at most _TAIL_VALUE bytes each.
_PARSE_WHOLE = 256 * 1024
_TAIL_VALUE = 16 * 1024
T = TypeVar("T")
# Only events holding one of these keys can change what the tap reports (a JSON key is always quoted).
_PARSED = (b'"timings"', b'"usage"', b'"error"', b'"message_stop"', b'"message_start"',
           b'"response.completed"')
# The last event of a stream without `[DONE]`: Anthropic's, and OpenAI Responses'.
_LAST_EVENTS = frozenset({"message_stop", "response.completed"})


@dataclass(frozen=True, slots=True)
class Stats:
    """Token counts of one finished request. `cache_n` is None when the server did not say."""

    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    prompt_ms: float | None = None  # how long the server took to compute `prompt_n` (timings only)
    # Of `cache_n`, what a patched server shared from another slot's cells (`--slot-attach`) and what it
    # copied from a RAM prefix entry (`--cache-prefix`); None from an upstream server.
    attached_n: int | None = None
    prefix_n: int | None = None
    # The tokens of the prompt a RAM prefix entry of that server holds after the request (its head, up to
    # the first user message: kept before, or saved by this prefill); None from other servers.
    prefix_entry_n: int | None = None

    @property
    def n_tokens(self) -> int:
        """Tokens the slot holds afterwards: reused + evaluated prompt + generated."""
        return (self.cache_n or 0) + (self.prompt_n or 0) + (self.predicted_n or 0)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def stats_from(obj: Any, previous: Stats | None = None) -> Stats | None:
    """Merge the statistics found in one JSON object (a response body or an SSE event) into `previous`.

    `timings` wins over `usage` because it splits the prompt into reused (`cache_n`) and evaluated
    (`prompt_n`) parts on every route."""
    if not isinstance(obj, Mapping):
        return previous
    if obj.get("type") == "message_start" and isinstance(obj.get("message"), Mapping):
        obj = obj["message"]  # Anthropic stream: usage sits inside the message object
    elif obj.get("type") == "response.completed" and isinstance(obj.get("response"), Mapping):
        obj = {**obj["response"], **obj}  # Responses stream: usage in the response, timings beside it
    stats = previous
    usage = obj.get("usage")
    if isinstance(usage, Mapping):
        stats = _merge(stats, _from_usage(usage))
    timings = obj.get("timings")
    if isinstance(timings, Mapping):
        stats = _merge(stats, Stats(_int(timings.get("cache_n")), _int(timings.get("prompt_n")),
                                    _int(timings.get("predicted_n")), _float(timings.get("prompt_ms")),
                                    _int(timings.get("attached_n")), _int(timings.get("prefix_n")),
                                    _int(timings.get("prefix_entry_n"))))
    return stats


def _from_usage(usage: Mapping[str, Any]) -> Stats:
    details = usage.get("input_tokens_details")
    if isinstance(details, Mapping):
        # OpenAI Responses: input_tokens includes the cached part.
        cached, given = _int(details.get("cached_tokens")), _int(usage.get("input_tokens"))
        return Stats(cached, given - cached if given is not None and cached is not None else given,
                     _int(usage.get("output_tokens")))
    if "cache_read_input_tokens" in usage or "input_tokens" in usage or "output_tokens" in usage:
        # Anthropic: input_tokens excludes the cached part. A stream's `message_delta` carries
        # `output_tokens` alone: the generated count, merged into what `message_start` said.
        return Stats(_int(usage.get("cache_read_input_tokens")), _int(usage.get("input_tokens")),
                     _int(usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    prompt = _int(usage.get("prompt_tokens"))
    evaluated = prompt - cached if prompt is not None and cached is not None else None
    return Stats(cached, evaluated, _int(usage.get("completion_tokens")))


def _merge(old: Stats | None, new: Stats) -> Stats:
    if old is None:
        return new
    return Stats(_first(new.cache_n, old.cache_n), _first(new.prompt_n, old.prompt_n),
                 _first(new.predicted_n, old.predicted_n), _first(new.prompt_ms, old.prompt_ms),
                 _first(new.attached_n, old.attached_n), _first(new.prefix_n, old.prefix_n),
                 _first(new.prefix_entry_n, old.prefix_entry_n))


def _first(new: T | None, old: T | None) -> T | None:
    return new if new is not None else old


def stats_from_body(body: bytes) -> Stats | None:
    """The statistics of a whole (non-streamed) answer. A large one (logprobs of every token) is not
    parsed whole, which would cost several times its size in Python objects for two small keys:
    only the values of its last `timings` and `usage` keys are (llama-server writes them last)."""
    if len(body) > _PARSE_WHOLE:
        return _stats_from_tail(body)
    try:
        return stats_from(orjson.loads(body))
    except (ValueError, RecursionError):
        return None


def _stats_from_tail(body: bytes) -> Stats | None:
    found: dict[str, Any] = {}
    decoder = json.JSONDecoder()
    for key in ("usage", "timings"):
        # A key inside a string value has escaped quotes, so this finds a key of some object.
        at = body.rfind(b'"' + key.encode() + b'":')
        if at < 0:
            continue
        text = body[at + len(key) + 3 : at + len(key) + 3 + _TAIL_VALUE].decode("utf-8", "replace")
        try:
            found[key] = decoder.raw_decode(text.lstrip())[0]
        except ValueError:
            continue
    return stats_from(found) if found else None


class SSETap:
    """Incremental SSE reader over a copy of the stream; `stats` holds the latest statistics."""

    def __init__(self) -> None:
        self.stats: Stats | None = None
        self.saw_error = False
        # The stream's last event has been seen (`[DONE]` for OpenAI routes, `message_stop` for
        # Anthropic's, `response.completed` for Responses): whatever follows is only the end of the body.
        self.finished = False
        self._buf = b""
        self._pending_cr = False
        self._data: list[bytes] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> None:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._pending_cr = chunk.endswith(b"\r")
        data = self._buf + chunk
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > _MAX_LINE:
            self._buf = b""
        for line in lines:
            self._line(line)

    def close(self) -> None:
        """End of stream: a final event without its blank line still counts."""
        if self._buf:
            self._line(self._buf)
            self._buf = b""
        self._line(b"")

    def _line(self, line: bytes) -> None:
        if not line:
            if self._data:
                self._event(b"\n".join(self._data))
                self._data = []
                self._data_bytes = 0
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
            self._data_bytes += len(value)
            if self._data_bytes > _MAX_LINE:  # an event no llama-server writes: drop it, stay bounded
                self._data = []
                self._data_bytes = 0

    def _event(self, data: bytes) -> None:
        if data.strip() == b"[DONE]":
            self.finished = True
            return
        if not any(marker in data for marker in _PARSED):
            return  # a token delta: nothing this tap reads, and parsing each one was most of its cost
        try:
            obj = orjson.loads(data)  # C: the stdlib parser was ~1% of the gateway's CPU
        except (ValueError, RecursionError):
            return
        if isinstance(obj, Mapping) and "error" in obj:
            self.saw_error = True
        if isinstance(obj, Mapping) and obj.get("type") in _LAST_EVENTS:
            self.finished = True
        self.stats = stats_from(obj, self.stats)

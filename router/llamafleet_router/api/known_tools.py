"""Tool lists seen before, found by their bytes in the next request that carries them.

An agent client sends the same `tools` (~50 KB of schemas for the agent layout) with every request of
every session. Parsing them, walking their depth, keying them for the template cache and encoding them
again for the pod cost about twenty times what the rest of the body costs (orjson parses the 60K-
character agent body in ~76 us, the same body without its tools in ~3 us). So a body whose
top-level `tools` value is, byte for byte, one this gateway learned gets the learned parsed value, and
only the rest of it is parsed: the value's bytes are spliced out for a marker, and the marker must come
back as the document's top-level `tools`.

Why that is the full parse: the marker is a JSON string holding a random nonce no client can know, so
the spliced document's top-level `tools` is the marker only when the splice replaced exactly that
value; and a JSON value parses to the same thing wherever it sits. Anything else (no match, a spliced
document that does not parse, the marker elsewhere) falls back to the full parse.

The learned value is one object shared by every request that carries those bytes: nothing on the
request path may change it in place (`tests/router/test_known_tools.py` runs requests through the
gateway and compares it with a fresh parse). Entries are per tenant group, so that a tenant cannot time
whether another sent the same schemas, and learned on a list's second sighting: learning locates the
value's end with the standard library's scanner (about two parses), and a client whose tools change on
every request then pays only a fingerprint. At most `max_entries` lists (16) of at most `max_bytes`
(256 KiB) each are kept, least recently used first out: a few MB with their parses, at most ~14 MB.
A body is spliced and parsed once at most, and learning tries two values at most, so a body made of
copies of a learned list costs no more than parsing it whole.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from llamafleet_router.api.nesting import depth

_KEY = b'"tools"'
_BLANK = b" \t\r\n"
_MAX_KEYS_TRIED = 8  # "tools" as a string elsewhere in the body (a message about tools) comes first
_MAX_SPANS_TRIED = 2  # values scanned and spliced to learn one list: each costs about a parse


@dataclass(frozen=True, slots=True)
class KnownTools:
    """A learned `tools` value: its bytes as the client wrote them, their parse (shared: never
    changed in place), and how deep it nests (`nesting.depth`)."""

    raw: bytes
    value: list[Any]
    depth: int


class ToolSpans:
    """The learned tool lists of one gateway process (most recent first), bounded in number and size."""

    def __init__(self, *, max_entries: int = 16, max_bytes: int = 256 * 1024, min_bytes: int = 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes  # a larger list is parsed every time: the cache's memory stays bounded
        self.min_bytes = min_bytes  # a smaller one costs less to parse than to find
        self._entries: list[tuple[str, KnownTools]] = []
        self._sightings: OrderedDict[tuple[str, int, bytes, bytes], None] = OrderedDict()
        self._marker = "llamafleet-known-tools:" + secrets.token_hex(16)
        self._marker_bytes = orjson.dumps(self._marker)
        self.hits = 0
        self.learned = 0

    def __len__(self) -> int:
        """The lists learned and kept now."""
        return len(self._entries)

    def parse(self, raw: bytes, group: str) -> tuple[dict[str, Any], KnownTools] | None:
        """`raw` parsed with a learned `tools` value of `group`'s, and that entry; None when none fits
        (the caller parses the whole body)."""
        if not self._entries:
            return None
        for start in _value_starts(raw):
            for i, (owner, known) in enumerate(self._entries):
                if owner == group and raw.startswith(known.raw, start):
                    # One splice per body at most: a body of many copies costs no more than one parse.
                    body = self._spliced(raw, start, start + len(known.raw))
                    if body is None:
                        return None
                    body["tools"] = known.value
                    if i:
                        self._entries.insert(0, self._entries.pop(i))
                    self.hits += 1
                    return body, known
        return None

    def learn(self, raw: bytes, body: dict[str, Any], group: str) -> None:
        """Remember `body`'s `tools` (parsed from `raw`) for `group`, on the list's second sighting."""
        tools = body.get("tools")
        if type(tools) is not list or not tools:
            return
        try:
            canonical = orjson.dumps(tools)
        except (TypeError, orjson.JSONEncodeError):
            return
        if not self.min_bytes <= len(canonical) <= self.max_bytes:
            return
        sighting = (group, len(canonical), canonical[:64], canonical[-64:])
        if sighting not in self._sightings:
            self._sightings[sighting] = None
            if len(self._sightings) > 4 * self.max_entries:
                self._sightings.popitem(last=False)
            return
        span = self._span(raw)
        if span is None or span[1] - span[0] > self.max_bytes:
            return
        known = KnownTools(raw[span[0]:span[1]], tools, depth(tools))
        if any(owner == group and entry.raw == known.raw for owner, entry in self._entries):
            return  # learned already, and passed over for a reason of this body's (a nested copy first)
        self._entries = [(group, known), *self._entries[:self.max_entries - 1]]
        self.learned += 1

    def _span(self, raw: bytes) -> tuple[int, int] | None:
        """Where the top-level `tools` value of `raw` lies, proven by the splice."""
        # latin-1 maps each byte to one character, so the scanner's offsets are byte offsets; the JSON
        # structure is ASCII, and what sits inside strings only has to be scanned past.
        text = raw.decode("latin-1")
        scan = json.JSONDecoder()
        for tried, start in enumerate(_value_starts(raw)):
            if tried == _MAX_SPANS_TRIED:
                break
            try:
                end = scan.raw_decode(text, start)[1]
            except ValueError:
                continue
            if self._spliced(raw, start, end) is not None:
                return start, end
        return None

    def _spliced(self, raw: bytes, start: int, end: int) -> dict[str, Any] | None:
        """`raw` with bytes `start:end` replaced by the marker, parsed, when the marker is then the
        document's top-level `tools`."""
        try:
            body = orjson.loads(raw[:start] + self._marker_bytes + raw[end:])
        except orjson.JSONDecodeError:
            return None
        if type(body) is not dict or body.get("tools") != self._marker:
            return None
        return body


def _value_starts(raw: bytes) -> Iterator[int]:
    """Where a value follows a `"tools"` key in `raw`, one at a time (a candidate, not a proof): the
    first is nearly always the top-level key, and each search runs on through the rest of the body."""
    at, tried = raw.find(_KEY), 0
    while at >= 0 and tried < _MAX_KEYS_TRIED:
        tried += 1
        i = at + len(_KEY)
        while i < len(raw) and raw[i] in _BLANK:
            i += 1
        if i < len(raw) and raw[i] == 0x3A:  # ':'
            i += 1
            while i < len(raw) and raw[i] in _BLANK:
                i += 1
            yield i
        at = raw.find(_KEY, at + 1)

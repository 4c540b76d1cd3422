"""`TemplateCache`: compiled chat templates and their renders, kept across requests (LRU).

Split from template.py, which holds what llama.cpp does around a render; this holds what makes a render
cheap enough for every request: one compile per template source, a render cache keyed by a digest of
everything a render depends on (tools enter through their JSON texts' digest), and the normalized tool
lists. A failing render is remembered too, since it costs as much as a good one.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from jinja2 import Template, TemplateError

from llamafleet_core.prefix.jinja_env import make_environment, render_without_cycles
from llamafleet_core.prefix.llama_json import PrecomputedJson
from llamafleet_core.prefix.normalize import normalize_tools

__all__ = ["TemplateCache", "TemplateError"]

_MAX_TOOL_LISTS = 32
_RECENT_KEYS = 4


@dataclass(frozen=True)
class _Failed:
    reason: str


class TemplateCache:
    """Compiled templates keyed by source text, and renders keyed by a digest of their inputs (both LRU).

    One instance per router process is passed to every `ChatTemplate`, so refreshing a template from
    `/props` does not compile it again. Render results are cached because the session-prefix render
    (tools + system + history) repeats across sessions that start the same way.
    """

    def __init__(self, max_templates: int = 16, max_renders: int = 256) -> None:
        self._env = make_environment()
        self._templates: OrderedDict[str, Template] = OrderedDict()
        self._sources: dict[str, bytes] = {}
        self._renders: OrderedDict[bytes, str | _Failed] = OrderedDict()
        self.max_templates = max_templates
        self.max_renders = max_renders
        self.render_hits = 0
        # Normalized tools by request object (one request renders two or three times) and by content
        # (an agent sends the same tools on every turn, in a new request object each time).
        self._tools: OrderedDict[int, tuple[Any, list[PrecomputedJson] | None]] = OrderedDict()
        self._tools_by_json: OrderedDict[bytes, list[PrecomputedJson] | None] = OrderedDict()
        self._recent_keys: list[bytes] = []  # the latest distinct keys of `_tools_by_json` (`_known_key`)
        self._tool_digests: dict[int, tuple[list[PrecomputedJson], bytes]] = {}
        # Block chains of session prefixes, keyed by the render they were cut from (see identity.py).
        self.chains: OrderedDict[tuple[str, bytes, int, str, int], tuple[str, ...]] = OrderedDict()
        # Whether a shape's render copies the last question verbatim, by that render (see substitute.py).
        self.substitutions: dict[int, tuple[str, tuple[int, int] | None]] = {}

    def tools(self, raw: Any) -> list[PrecomputedJson] | None:
        """`normalize_tools(raw)`, computed once per distinct tool list.

        The identity entry holds `raw` itself, so its id cannot be reused while cached. The content key
        is the compact JSON of `raw` (orjson: ~0.1 ms for 50 KB of schemas, where normalizing them takes
        ~1 ms); JSON cannot tell NaN from null there, but the gateway refuses NaN, as llama-server does.
        """
        if raw is None:
            return None
        hit = self._tools.get(id(raw))
        if hit is not None and hit[0] is raw:
            return hit[1]
        try:
            key: bytes | None = orjson.dumps(raw)
        except (TypeError, orjson.JSONEncodeError):  # not plain JSON data: no content key
            key = None
        if key is not None:
            key = self._known_key(key)
        if key is not None and key in self._tools_by_json:
            tools = self._tools_by_json[key]
            self._tools_by_json.move_to_end(key)
        else:
            tools = normalize_tools(raw)
            if key is not None:
                self._tools_by_json[key] = tools
                self._recent_keys = [key, *self._recent_keys[:_RECENT_KEYS - 1]]
                if len(self._tools_by_json) > _MAX_TOOL_LISTS:
                    self._tools_by_json.popitem(last=False)
        self._tools[id(raw)] = (raw, tools)
        while len(self._tools) > 8:
            self._tools.popitem(last=False)
        return tools

    def _known_key(self, key: bytes) -> bytes:
        """The stored key equal to `key`, when it is one of the latest tool lists, else `key`.

        A new bytes object hashes all its bytes on its first dict lookup (~30 us for an agent's 50 KB
        of schemas, more than the JSON encoding); a stored key's hash is kept, and comparing equal
        lengths is a memcmp (~4 us)."""
        for known in self._recent_keys:
            if known == key:
                return known
        return key

    def tools_digest(self, tools: list[PrecomputedJson]) -> bytes:
        """Digest of a normalized tool list's JSON texts, computed once per list (they are cached)."""
        hit = self._tool_digests.get(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1]
        h = hashlib.blake2b(digest_size=16)
        for tool in tools:
            h.update(b"\x00" + tool.json_text.encode("utf-8", "surrogatepass"))
        if len(self._tool_digests) > 2 * _MAX_TOOL_LISTS:
            self._tool_digests.clear()
        self._tool_digests[id(tools)] = (tools, h.digest())
        return h.digest()

    def compile(self, source: str) -> Template:
        tmpl = self._templates.get(source)
        if tmpl is None:
            tmpl = self._env.from_string(source)
            self._templates[source] = tmpl
            while len(self._templates) > self.max_templates:
                self._templates.popitem(last=False)
        else:
            self._templates.move_to_end(source)
        return tmpl

    def render(self, source: str, context: dict[str, Any], *, remember: bool = True) -> str:
        """Render `context`; with `remember`, through the cache. A prompt that ends in a new question
        is rendered once and never again, so its callers skip the key (a digest of the whole context)."""
        if not remember:
            try:
                return render_without_cycles(self.compile(source), context)
            except Exception as exc:  # the same contract as the cached path
                raise TemplateError(f"{type(exc).__name__}: {exc}") from exc
        key = self._render_key(source, context)
        hit = self._renders.get(key)
        if hit is not None:
            self._renders.move_to_end(key)
            self.render_hits += 1
        else:
            try:
                hit = render_without_cycles(self.compile(source), context)
            except Exception as exc:  # remembered too: a failing render costs as much as a good one
                hit = _Failed(f"{type(exc).__name__}: {exc}")
            self._renders[key] = hit
            while len(self._renders) > self.max_renders:
                self._renders.popitem(last=False)
        if isinstance(hit, _Failed):
            raise TemplateError(hit.reason)
        return hit


    def _source_digest(self, source: str) -> bytes:
        """A template source's digest, once per source: hashing its ~8 KB on every render key cost
        about a third of the key."""
        digest = self._sources.get(source)
        if digest is None:
            if len(self._sources) >= 2 * self.max_templates:
                self._sources.clear()
            digest = self._sources[source] = hashlib.blake2b(
                source.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        return digest

    def _render_key(self, source: str, context: dict[str, Any]) -> bytes:
        """Digest of everything a render depends on; tools enter through their JSON texts' digest."""
        h = hashlib.blake2b(self._source_digest(source), digest_size=16)
        rest = {k: v for k, v in context.items() if k != "tools"}
        h.update(_context_json(rest))
        tools = context.get("tools")
        if tools:
            h.update(b"\x01" + self.tools_digest(tools))
        return h.digest()


def _context_json(rest: dict[str, Any]) -> bytes:
    """The render context's JSON, for its key: orjson (the system prompt of an agent request is ~10K
    characters, and the standard encoder was most of the key), the standard encoder for what orjson
    refuses (lone surrogates, integers past 64 bits, keys that are not strings). A first byte tells the
    two apart, so that no context of one can give another's key. As with the tools' key, NaN reads as
    null here; the gateway refuses NaN in a request."""
    try:
        return b"o" + orjson.dumps(rest, default=repr)
    except (TypeError, orjson.JSONEncodeError):
        return b"j" + json.dumps(rest, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass")

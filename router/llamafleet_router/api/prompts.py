"""A request's prompt identity, rendered with its model's chat template (from a pod's `/props`).

ChatTemplate objects are cached per (model, template source), so the jinja compile and the render cache
live across requests; a pod upgrade that changes the template simply gets a new entry (the cache is
small and LRU). Client input that yields no prompt becomes a 400.

The block hashes are keyed with the fleet's `prefix_key` and namespaced by the key's tenant group
(`tenancy.py`): both change the hashes only, never the rendered text or the session cut.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from llamafleet_core.prefix import (
    ChatTemplate,
    PromptError,
    PromptIdentity,
    TemplateCache,
    chat_identity,
    completion_identity,
)
from llamafleet_router.api import responses
from llamafleet_router.api.anthropic import chat_tools, to_chat_body
from llamafleet_router.api.parse import ParsedRequest, Route
from llamafleet_router.discovery.base import PodProps
from llamafleet_router.errors import bad_request

_MAX_TEMPLATES = 32


class PromptRenderer:
    def __init__(self, block_chars: int, key: bytes = b"") -> None:
        self.block_chars = block_chars
        self._key = key
        self._render_cache = TemplateCache()
        self._templates: OrderedDict[tuple[str, str], ChatTemplate] = OrderedDict()
        self._by_props: dict[int, tuple[PodProps, str, ChatTemplate]] = {}
        self._chat_tools: OrderedDict[int, tuple[list[Any], list[dict[str, Any]]]] = OrderedDict()

    def template(self, model: str, props: PodProps | None) -> ChatTemplate | None:
        if props is None or not props.chat_template:
            return None
        # Discovery keeps one PodProps object per pod until its /props changes, so the object itself is
        # the fast key; hashing the whole template text on every request cost more than the render.
        seen = self._by_props.get(id(props))
        if seen is not None and seen[0] is props and seen[1] == model:
            return seen[2]
        template = self._template(model, props)
        if len(self._by_props) >= _MAX_TEMPLATES:
            self._by_props.clear()
        self._by_props[id(props)] = (props, model, template)  # holding `props` keeps its id unique
        return template

    def _template(self, model: str, props: PodProps) -> ChatTemplate:
        key = (model, hashlib.sha256(repr(sorted(props.template_props().items())).encode()).hexdigest())
        template = self._templates.get(key)
        if template is None:
            template = ChatTemplate.from_props(props.template_props(), cache=self._render_cache)
            self._templates[key] = template
            if len(self._templates) > _MAX_TEMPLATES:
                self._templates.popitem(last=False)
        else:
            self._templates.move_to_end(key)
        return template

    def _converted_tools(self, tools: list[Any]) -> list[dict[str, Any]]:
        """Anthropic tools as chat tools, converted once per list object. A learned list
        (`known_tools.py`) is the same object on every request, and so then is its conversion, which
        the template cache finds by identity instead of encoding ~50 KB of schemas to key it. Holding
        `tools` keeps its id from being reused while the entry lives."""
        hit = self._chat_tools.get(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1]
        converted = chat_tools(tools)
        self._chat_tools[id(tools)] = (tools, converted)
        if len(self._chat_tools) > _MAX_TEMPLATES:
            self._chat_tools.popitem(last=False)
        return converted

    def identity(
        self, parsed: ParsedRequest, model: str, props: PodProps | None, namespace: str = ""
    ) -> PromptIdentity:
        try:
            if parsed.route is Route.COMPLETIONS:
                return completion_identity(parsed.body, model=model, block_chars=self.block_chars,
                                           namespace=namespace, key=self._key)
            if parsed.route is Route.MESSAGES:
                body = to_chat_body(parsed.body, self._converted_tools)
            elif parsed.route is Route.RESPONSES:
                body = responses.to_chat_body(parsed.body)  # routed like the chat request it becomes
            else:
                body = parsed.body
            return chat_identity(body, self.template(model, props), model=model, block_chars=self.block_chars,
                                 namespace=namespace, key=self._key)
        except PromptError as exc:
            raise bad_request(f"Invalid request: {exc}", code="invalid_prompt") from None

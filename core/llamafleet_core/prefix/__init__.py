"""Prefix identity: render a request's prompt as llama-server would, chain its block hashes, cut its
session prefix at a special-token boundary. Pure code: no I/O, no clients."""

from llamafleet_core.prefix.hashing import (
    BLOCK_CHARS,
    block_chain,
    common_blocks,
    extend_chain,
    namespaced_seed,
    prefix_key_bytes,
)
from llamafleet_core.prefix.identity import (
    PromptIdentity,
    chat_identity,
    completion_identity,
    special_token_start,
)
from llamafleet_core.prefix.template import (
    ChatTemplate,
    PromptError,
    Rendered,
    canonical_render,
    render_chat,
)
from llamafleet_core.prefix.template_cache import TemplateCache

__all__ = [
    "BLOCK_CHARS",
    "ChatTemplate",
    "PromptError",
    "PromptIdentity",
    "Rendered",
    "TemplateCache",
    "block_chain",
    "canonical_render",
    "chat_identity",
    "common_blocks",
    "completion_identity",
    "extend_chain",
    "namespaced_seed",
    "prefix_key_bytes",
    "render_chat",
    "special_token_start",
]

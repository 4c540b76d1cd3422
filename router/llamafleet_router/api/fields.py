"""Which request fields reach llama-server, per route, and within which bounds.

llama-server reads far more of a body than the OpenAI and Anthropic APIs define, and some of it acts
outside the request: `n`/`n_cmpl` above 1 run child tasks in *other* idle slots, which the gateway has
not leased and whose cached prefixes they evict; `lora` changes the adapter scales (and clears the
slot's cache); `n_keep`/`n_discard` steer context shifting; `grammar`, `samplers`, `n_probs`,
`t_max_predict_ms`, `chat_parser` and the like set what the server itself normally decides. So the
gateway forwards an allow-list per route:

- the fields of the official SDKs (openai's chat and text completion params, anthropic's message
  params), which llama-server reads as documented or ignores;
- on the OpenAI routes, a chosen set of llama.cpp sampling knobs: per-token cost, no state beyond the
  request (`LLAMA_SAMPLING`);
- `id_slot` and `cache_prompt`, which `pinned_body` always overrides (the router chooses the slot, and
  prompt caching stays on: a client's `false` would only cost a recompute, silently, by design);
- whatever `extra_fields` allows, for every key or for one key (e.g. `batch:grammar`): llama-server's
  own `n_cmpl` (then bounded like `n`), `lora` (it changes the pod's adapters for the request's slot),
  `grammar`, `samplers`, `n_probs` (bounded) and the context-shift settings are never on by default.

Anything else gets a 400 naming the field, as OpenAI answers an unrecognized argument. Bounds: `n`
(`best_of`, `n_cmpl`) at most `max_n`; `top_logprobs`, `logprobs` and `n_probs` at most `max_logprobs`;
`max_tokens`, `max_completion_tokens` and `n_predict` integers from 0, lowered to the key's
`max_tokens_per_request`, which is also sent when the client sets none (llama-server would otherwise
generate to the end of the slot's context); on `/v1/responses` the length is `max_output_tokens`.
On `/v1/messages` and `/v1/messages/count_tokens` the errors are Anthropic-shaped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llamafleet_router.access.limits import PerKey
from llamafleet_router.api import responses
from llamafleet_router.api.parse import ANTHROPIC_ROUTES, DIRECT_ROUTES, ParsedRequest, Route
from llamafleet_router.api.shapes import CHAT_PARTS, ShapeError, ShapeLimits, check_shapes
from llamafleet_router.discovery.base import PodProps
from llamafleet_router.errors import ApiError
from llamafleet_router.settings import FIELD_NAME, RouterSettings

_OPENAI = frozenset({
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "user",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
})
CHAT = _OPENAI | {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
    "response_format", "max_completion_tokens", "top_logprobs", "metadata", "store", "reasoning_effort",
    "modalities", "audio", "prediction", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "safety_identifier", "verbosity", "web_search_options", "moderation",
    "chat_template_kwargs",  # checked in shapes.py: no key the server sets itself
}
COMPLETIONS = _OPENAI | {"prompt", "best_of", "echo", "suffix"}
MESSAGES = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream", "temperature",
    "thinking", "tool_choice", "tools", "top_k", "top_p", "cache_control", "container", "inference_geo",
    "output_config", "service_tier", "context_management", "mcp_servers", "output_format",
    "chat_template_kwargs",  # llama-server passes it through its Anthropic conversion
})
#: llama.cpp sampling knobs clients send through the OpenAI SDK's `extra_body` (llama-server drops all
#: but `top_k` from Anthropic bodies). Their cost is per token; the length is bounded by `n_predict`.
LLAMA_SAMPLING = frozenset({
    "top_k", "min_p", "typical_p", "top_n_sigma", "repeat_penalty", "repeat_last_n", "mirostat",
    "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent", "xtc_probability",
    "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "ignore_eos", "n_predict",
})
#: Anthropic's count_tokens params: the message params that shape the prompt, without generation's.
COUNT_TOKENS = frozenset({
    "model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers", "context_management",
    "output_format", "output_config", "cache_control", "chat_template_kwargs",
})
#: openai's ResponseCreateParams; what llama-server cannot do is refused by name (`responses.py`).
RESPONSES = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_logprobs",
    "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options", "metadata", "store", "user",
    "text", "reasoning", "truncation", "include", "service_tier", "safety_identifier", "prompt_cache_key",
    "prompt_cache_retention", "prompt_cache_options", "moderation", "previous_response_id",
    "conversation", "prompt", "background", "background_options", "max_tool_calls", "context_management",
    "image", "access_programs", "chat_template_kwargs",
})
EMBEDDINGS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
OVERRIDDEN = frozenset({"id_slot", "cache_prompt"})
ALLOWED: Mapping[Route, frozenset[str]] = {
    Route.CHAT: CHAT | LLAMA_SAMPLING | OVERRIDDEN,
    Route.COMPLETIONS: COMPLETIONS | LLAMA_SAMPLING | OVERRIDDEN,
    Route.MESSAGES: MESSAGES | OVERRIDDEN,
    Route.COUNT_TOKENS: COUNT_TOKENS,
    Route.RESPONSES: RESPONSES | LLAMA_SAMPLING | OVERRIDDEN,
    Route.EMBEDDINGS: EMBEDDINGS,
}
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")
COUNT_FIELDS = ("n", "best_of", "n_cmpl")
PROBS_FIELDS = ("top_logprobs", "logprobs", "n_probs")


class FieldRejected(ApiError):
    """A 400 for a field or a shape; on `/v1/messages` in Anthropic's error shape."""

    def __init__(self, message: str, *, param: str, code: str, anthropic: bool) -> None:
        super().__init__(400, message, param=param, code=code)
        self.anthropic = anthropic

    def body(self) -> dict[str, Any]:
        if self.anthropic:
            return {"type": "error", "error": {"type": "invalid_request_error", "message": self.message}}
        return super().body()


@dataclass(frozen=True, slots=True)
class ExtraFields:
    """Fields allowed beyond the table: `every` for all keys, `by_key` for one key each."""

    every: frozenset[str] = frozenset()
    by_key: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, items: Iterable[str]) -> ExtraFields:
        """`["grammar", "batch:lora"]`: a bare name for every key, `key:name` for one key."""
        every: set[str] = set()
        by_key: dict[str, set[str]] = {}
        for item in (text.strip() for text in items):
            if not item:
                continue
            key, sep, name = item.rpartition(":")
            if not FIELD_NAME.fullmatch(name) or (sep and not key.strip()):
                raise ValueError(f"an extra field is `name` or `key:name`: {item!r}")
            (by_key.setdefault(key.strip(), set()) if sep else every).add(name)
        return cls(frozenset(every), {k: frozenset(v) for k, v in by_key.items()})

    def of(self, key: str) -> frozenset[str]:
        return self.every | self.by_key.get(key, frozenset())


@dataclass(frozen=True, slots=True)
class FieldPolicy:
    max_tokens: PerKey = field(default_factory=lambda: PerKey(32768))
    max_n: int = 1
    max_logprobs: int = 20
    extra: ExtraFields = field(default_factory=ExtraFields)
    shapes: ShapeLimits = field(default_factory=ShapeLimits)

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> FieldPolicy:
        return cls(
            max_tokens=PerKey.parse(settings.max_tokens_per_request), max_n=settings.max_n,
            max_logprobs=settings.max_logprobs, extra=ExtraFields.parse(settings.extra_fields),
            shapes=ShapeLimits(max_messages=settings.max_messages,
                               max_content_parts=settings.max_content_parts,
                               max_tools=settings.max_tools, max_json_depth=settings.max_json_depth),
        )

    def allowed(self, route: Route, key: str) -> frozenset[str]:
        return ALLOWED[route] | self.extra.of(key)

    def check(self, parsed: ParsedRequest, key: str) -> ParsedRequest:
        """The request with its lengths lowered to the key's cap; FieldRejected for a field outside
        the allow-list, a value past its bound, or a shape llama-server cannot take."""
        route, body = parsed.route, parsed.body
        anthropic = route in ANTHROPIC_ROUTES
        allowed = self.allowed(route, key)
        unknown = [name for name in body if name not in allowed]
        if unknown:
            names = ", ".join(f"`{n[:64]}`" for n in unknown[:8])
            raise FieldRejected(
                f"Unrecognized request argument supplied: {names}. This gateway forwards the "
                f"{'Anthropic' if anthropic else 'OpenAI'} API's fields and a set of llama.cpp sampling "
                "options only.", param=unknown[0][:64], code="unknown_parameter", anthropic=anthropic)
        for name in COUNT_FIELDS:
            self._bounded(body, name, 1, self.max_n, anthropic)
        for name in PROBS_FIELDS:
            if not (name == "logprobs" and isinstance(body.get(name), bool)):
                self._bounded(body, name, 0, self.max_logprobs, anthropic)
        try:
            if route is Route.RESPONSES:  # checked as the chat request llama-server makes of it
                check_shapes(responses.to_chat_body(body), chat=True, anthropic=False, limits=self.shapes)
            else:
                known = parsed.known_tools
                check_shapes(body, chat=route is Route.CHAT, anthropic=anthropic, limits=self.shapes,
                             known_tools=(known.value, known.depth) if known is not None else None)
        except ShapeError as exc:
            message = f"{exc} (in the chat request `input` becomes)" if route is Route.RESPONSES else str(exc)
            raise FieldRejected(message, param=exc.param, code=exc.code, anthropic=anthropic) from None
        cap = self.max_tokens.of(key)
        lowered: dict[str, int] = {}
        for name in LENGTH_FIELDS:
            value = self._bounded(body, name, 0, None, anthropic)
            if value is not None and 0 < cap < value:
                lowered[name] = cap
        if route is Route.CHAT and body.get("logprobs") is True and body.get("top_logprobs") is None \
                and self.max_logprobs < 20:
            lowered["top_logprobs"] = self.max_logprobs  # llama-server's default would be 20
        return dataclasses.replace(parsed, body={**body, **lowered}) if lowered else parsed

    def forwarded(self, parsed: ParsedRequest, key: str, props: PodProps | None) -> ParsedRequest:
        """The request as it goes to a pod of `props`: FieldRejected for media its model cannot take
        (llama-server answers those with a 500), and the key's length cap where the client set none."""
        route = parsed.route
        anthropic = route in ANTHROPIC_ROUTES
        if route in DIRECT_ROUTES:
            return parsed  # nothing is generated: no length to cap
        if route is Route.RESPONSES:
            parsed = dataclasses.replace(parsed, body=responses.normalized(parsed.body))
        media_body = responses.to_chat_body(parsed.body) if route is Route.RESPONSES else parsed.body
        if props is not None and props.modalities is not None and route is not Route.COMPLETIONS:
            for modality, at in media_used(media_body, anthropic=anthropic).items():
                if modality not in props.modalities:
                    raise FieldRejected(f"`{at}` needs {modality} input, which the model `{props.model}` "
                                        "does not take.", param=at, code="unsupported_content",
                                        anthropic=anthropic)
        cap = self.max_tokens.of(key)
        if cap > 0 and all(parsed.body.get(name) is None for name in LENGTH_FIELDS):
            name = "max_output_tokens" if route is Route.RESPONSES else "max_tokens"
            return dataclasses.replace(parsed, body={**parsed.body, name: cap})
        return parsed

    @staticmethod
    def _bounded(
        body: Mapping[str, Any], name: str, low: int, high: int | None, anthropic: bool,
    ) -> int | None:
        value = body.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise FieldRejected(f"`{name}` must be an integer.", param=name, code="invalid_type",
                                anthropic=anthropic)
        if value < low or (high is not None and value > high):
            limit = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise FieldRejected(f"`{name}` must be {limit} on this gateway; got {value}.", param=name,
                                code="invalid_value", anthropic=anthropic)
        return value


def media_used(body: Mapping[str, Any], *, anthropic: bool) -> dict[str, str]:
    """The `/props` modalities the body's content needs ("vision", "audio", "video"), each with the
    path of its first part (an Anthropic image may also sit inside a tool result)."""
    found: dict[str, str] = {}
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if not anthropic:
                modality = CHAT_PARTS.get(kind) if isinstance(kind, str) else None
            elif kind == "image" or (kind == "tool_result" and _has_image(part.get("content"))):
                modality = "vision"
            else:
                modality = None
            if modality is not None and modality not in found:
                found[modality] = f"messages[{i}].content[{j}]"
    return found


def _has_image(blocks: Any) -> bool:
    return isinstance(blocks, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in blocks)

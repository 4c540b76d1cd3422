"""The gateway's OpenAPI 3.1 document: its public routes, what they accept, and every status they answer.

It describes what the gateway itself checks (`api/parse.py`) and the fields it forwards (the allow-list
of `api/fields.py`, with its default bounds; any other field gets a 400, so `additionalProperties` is
false), so a schema-driven fuzzer (schemathesis) exercises exactly the router's own validation and
proxying. Statuses: 200; 400 (bad body), 401 (API key), 404 (unknown model), 413 (body too large),
429 (the key's limits) from the router, Anthropic-shaped on the Anthropic routes; 503 when no pod can
take the request; llama-server's own
4xx answers are relayed as they are. No 5xx other than 503 is part of the contract. The admin paths of
llama-server (`/slots`, `/props`, ...) are deliberately absent: the gateway never serves them.

`openapi_document()` is pure; `openapi_endpoint` serves it (`GET /openapi.json`, public, like /health).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from llamafleet_router.api.fields import ALLOWED
from llamafleet_router.api.parse import Route
from llamafleet_router.api.responses import UNSUPPORTED as RESPONSES_UNSUPPORTED

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}

# Anthropic's error shape: the gateway's own errors on `/v1/messages` and `/v1/messages/count_tokens`.
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
    }},
}

# One server-sent event (`data:` carries the JSON chunk, `[DONE]`, or an `error` object at a failure).
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
# Anthropic text as the shape checks take it (`api/shapes.py`): a string, or text blocks, never empty.
_ANTHROPIC_TEXT = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}

_LENGTH = {"type": "integer", "minimum": 0, "description": "Lowered to the key's `max_tokens_per_request`."}
_COMMON_BODY: dict[str, Any] = {
    "model": {"type": "string", "description": "A model the fleet serves; optional when it serves one."},
    "stream": {"type": "boolean", "default": False},
    "max_tokens": _LENGTH, "max_completion_tokens": _LENGTH, "n_predict": _LENGTH,
    "n": {"type": "integer", "minimum": 1, "maximum": 1, "description": "At most `max_n` (default 1)."},
    "best_of": {"type": "integer", "minimum": 1, "maximum": 1},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "temperature": {"type": "number"},
    "seed": {"type": "integer"},
    "user": {"type": "string", "description": "Session key: a scheduling tie-breaker, never trusted."},
    "id_slot": {"type": "integer", "description": "Ignored: the router chooses the slot."},
    "cache_prompt": {"type": "boolean", "description": "Ignored: prompt caching is always on."},
    "chat_template_kwargs": {"type": "object"},
}


def _message(*roles: str) -> dict[str, Any]:
    return {"type": "object", "required": ["role"],
            "properties": {"role": {"type": "string", "enum": list(roles)}, "content": _CONTENT}}


def _fields(route: Route, **own: Any) -> dict[str, Any]:
    """Every field the route forwards by default: its own schema where the document gives one."""
    return {name: own.get(name, _COMMON_BODY.get(name, {})) for name in sorted(ALLOWED[route])}


def _error(description: str, *, anthropic: bool = False) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{'AnthropicError' if anthropic else 'Error'}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _inference(summary: str, body: dict[str, Any], *, anthropic: bool = False,
               answer: dict[str, Any] | None = None) -> dict[str, Any]:
    def error(description: str) -> dict[str, Any]:
        return _error(description, anthropic=anthropic)

    ok = ({"description": "The pod's answer, relayed as it is.",
           "content": {"application/json": {"schema": answer}}} if answer is not None else
          {"description": "The pod's answer, relayed byte for byte (JSON, or SSE when `stream`).",
           "content": {"application/json": {"schema": {"type": "object"}},
                       "text/event-stream": {"schema": _SSE_EVENT}}})
    return {
        "summary": summary,
        "security": [{"bearer": []}, {"apiKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": ok,
            "400": error("The body is not what the route accepts (the router's or llama-server's check), "
                         "or holds a field outside the allow-list or past its bound."),
            "401": error("Missing or wrong API key (when keys are configured)."),
            "404": error("The model is not served by this fleet."),
            "413": error("The body is larger than the gateway accepts."),
            "429": error("Past one of the key's limits (see `retry-after`)."),
            "503": error("No pod serving the model is up; retry later (see `retry-after`)."),
        },
    }


def openapi_document(title: str = "llamafleet gateway", version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway's public routes (pure)."""
    chat = {"type": "object", "required": ["messages"], "additionalProperties": False, "properties": _fields(
        Route.CHAT, tools={"type": "array", "items": {"type": "object"}},
        messages={"type": "array", "minItems": 1,
                  "items": _message("system", "developer", "user", "assistant", "tool")},
    )}
    completion = {"type": "object", "required": ["prompt"], "additionalProperties": False,
                  "properties": _fields(Route.COMPLETIONS, prompt={"oneOf": [
            {"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        ]})}
    # At least one user message that asks something: without one the templates raise (`api/shapes.py`).
    anthropic_messages = {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]}, "content": _ANTHROPIC_TEXT}},
        "contains": {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}}}
    messages = {"type": "object", "required": ["messages", "max_tokens"], "additionalProperties": False,
                "properties": _fields(Route.MESSAGES, system=_ANTHROPIC_TEXT, messages=anthropic_messages)}
    count = {"type": "object", "required": ["messages"], "additionalProperties": False,
             "properties": _fields(Route.COUNT_TOKENS, system=_ANTHROPIC_TEXT, messages=anthropic_messages)}
    unsupported = {"description": "Not supported: a value (other than null, false or empty) gets a 400."}
    responses = {"type": "object", "required": ["input"], "additionalProperties": False,
                 "properties": _fields(
        Route.RESPONSES, max_output_tokens=_LENGTH, instructions={"type": "string"},
        input={"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        tools={"type": "array", "items": {"type": "object", "description": "Function tools only."}},
        **{name: unsupported for name in RESPONSES_UNSUPPORTED})}
    embeddings = {"type": "object", "required": ["input"], "additionalProperties": False,
                  "properties": _fields(
        Route.EMBEDDINGS, encoding_format={"type": "string", "enum": ["float", "base64"]},
        dimensions=unsupported, input={"oneOf": [
            {"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            {"type": "array", "minItems": 1, "items": {
                "type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}},
        ]})}
    model = {"type": "object", "required": ["id", "object"], "properties": {
        "id": {"type": "string"}, "object": {"const": "model"},
        "context_length": {"type": "integer", "description": "The smallest per-slot context of its pods."},
        "max_model_len": {"type": "integer"}, "meta": {"type": "object"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI- and Anthropic-compatible inference routed to llama-server pods."},
        "paths": {
            "/v1/chat/completions": {"post": _inference("OpenAI chat completion", chat)},
            "/v1/completions": {"post": _inference("OpenAI text completion", completion)},
            "/v1/messages": {"post": _inference("Anthropic Messages", messages, anthropic=True)},
            "/v1/messages/count_tokens": {"post": _inference(
                "Anthropic token count (rendered and tokenized by a pod; takes no slot)", count,
                anthropic=True, answer={"type": "object", "required": ["input_tokens"],
                                        "properties": {"input_tokens": {"type": "integer", "minimum": 0}}})},
            "/v1/responses": {"post": _inference("OpenAI Responses (routed like chat)", responses)},
            "/v1/embeddings": {"post": _inference(
                "OpenAI embeddings (pods started with `--embeddings`; 400 for a model that serves none)",
                embeddings, answer={"type": "object", "required": ["data"]})},
            "/v1/models": {"get": {
                "summary": "Models the fleet serves", "security": [{"bearer": []}, {"apiKey": []}],
                "responses": {"200": {"description": "OpenAI model list", "content": {
                    "application/json": {"schema": {"type": "object", "required": ["object", "data"],
                                                    "properties": {"data": {"type": "array",
                                                                            "items": model}}}}}},
                    "401": _error("Missing or wrong API key.")},
            }},
            "/v1/models/{model_id}": {"get": {
                "summary": "One model the fleet serves", "security": [{"bearer": []}, {"apiKey": []}],
                "parameters": [{"name": "model_id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OpenAI model", "content": {
                    "application/json": {"schema": model}}},
                    "401": _error("Missing or wrong API key."),
                    "404": _error("The model is not served by this fleet.")},
            }},
            "/health": {"get": {
                "summary": "Readiness: 200 when at least one pod is up (and the embedder's condition holds)",
                "security": [],
                "responses": {"200": {"description": "Ready", "content": {"application/json": {
                    "schema": {"type": "object", "required": ["status", "index", "pods"]}}}},
                    "503": {"description": "No pod up", "content": {"application/json": {
                        "schema": {"type": "object", "required": ["status"]}}}}},
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics", "security": [],
                "responses": {"200": {"description": "Prometheus text format",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}}},
            }},
            "/openapi.json": {"get": {
                "summary": "This document", "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1", "content": {
                    "application/json": {"schema": {"type": "object"}}}}},
            }},
        },
        "components": {
            "schemas": {"Error": _ERROR, "AnthropicError": _ANTHROPIC_ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
    }


async def openapi_endpoint(request: Request) -> JSONResponse:
    """`GET /openapi.json` (register with `Route("/openapi.json", openapi_endpoint, methods=["GET"])`)."""
    return JSONResponse(openapi_document())

"""The gateway's OpenAPI 3.1 document: its public routes, what they accept, and every status they answer.

It describes what the gateway itself checks (`api/parse.py`) and the fields it forwards (the allow-list
of `api/fields.py`, with its default bounds; any other field gets a 400, so `additionalProperties` is
false), so a schema-driven fuzzer (schemathesis) exercises exactly the router's own validation and
proxying. Statuses: 200; 400 (bad body), 401 (API key), 404 (unknown model), 413 (body too large) from
the router; 503 when no pod can take the request; llama-server's own
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

# One server-sent event (`data:` carries the JSON chunk, `[DONE]`, or an `error` object at a failure).
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}

_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}

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


def _error(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _inference(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": [{"bearer": []}, {"apiKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "The pod's answer, relayed byte for byte (JSON, or SSE when `stream`).",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": _SSE_EVENT}}},
            "400": _error("The body is not what the route accepts (the router's or llama-server's check), "
                          "or holds a field outside the allow-list or past its bound."),
            "401": _error("Missing or wrong API key (when keys are configured)."),
            "404": _error("The model is not served by this fleet."),
            "413": _error("The body is larger than the gateway accepts."),
            "503": _error("No pod serving the model is up; retry later (see `retry-after`)."),
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
    messages = {"type": "object", "required": ["messages", "max_tokens"], "additionalProperties": False,
                "properties": _fields(Route.MESSAGES, system=_CONTENT, messages={
                    "type": "array", "minItems": 1, "items": _message("user", "assistant")})}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI- and Anthropic-compatible inference routed to llama-server pods."},
        "paths": {
            "/v1/chat/completions": {"post": _inference("OpenAI chat completion", chat)},
            "/v1/completions": {"post": _inference("OpenAI text completion", completion)},
            "/v1/messages": {"post": _inference("Anthropic Messages", messages)},
            "/v1/models": {"get": {
                "summary": "Models the fleet serves", "security": [{"bearer": []}, {"apiKey": []}],
                "responses": {"200": {"description": "OpenAI model list", "content": {
                    "application/json": {"schema": {"type": "object", "required": ["object", "data"]}}}},
                    "401": _error("Missing or wrong API key.")},
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
            "schemas": {"Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
    }


async def openapi_endpoint(request: Request) -> JSONResponse:
    """`GET /openapi.json` (register with `Route("/openapi.json", openapi_endpoint, methods=["GET"])`)."""
    return JSONResponse(openapi_document())

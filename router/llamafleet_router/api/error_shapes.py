"""The gateway's own errors in the shape of the API the client called.

OpenAI clients parse `{"error": {"message", "type", "param", "code"}}` (`errors.py`); Anthropic's SDK
and Claude Code parse `{"type": "error", "error": {"type", "message"}}`, whose `type` follows the
status (`invalid_request_error`, `authentication_error`, `rate_limit_error`, `overloaded_error`...).
A stream the gateway has to cut (the pod died or hung mid-stream) ends with the route's own error
event: `data: {"error": ...}` for chat and completions, `event: error` with Anthropic's error body on
`/v1/messages`, and `event: error` on `/v1/responses` (whose data also carries `error`, which the
openai SDK raises on). Pure functions.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from llamafleet_router.api.parse import ANTHROPIC_ROUTES, Route
from llamafleet_router.errors import ApiError, sse_error_event
from llamafleet_router.proxy.relay import ErrorEvent

# Anthropic's error types by status (its API's documented errors); 5xx other than these: `api_error`.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
    429: "rate_limit_error", 499: "invalid_request_error", 503: "overloaded_error", 504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}


def error_body(err: ApiError, route: Route | None) -> dict[str, Any]:
    """`err`'s body as the route's API writes it (OpenAI's when the route is not known)."""
    if route in ANTHROPIC_ROUTES:
        return anthropic_body(err.status, err.message)
    return err.body()


def error_response(err: ApiError, route: Route | None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(err, route), status_code=err.status,
                        headers={**err.headers, **(headers or {})})


def _event(name: str, payload: dict[str, Any]) -> bytes:
    # The leading blank line ends whatever partial event the upstream left half-written.
    data = json.dumps(payload, separators=(",", ":"))
    return f"\n\nevent: {name}\ndata: {data}\n\n".encode()


def anthropic_error_event(message: str) -> bytes:
    return _event("error", anthropic_body(500, message))


def responses_error_event(message: str) -> bytes:
    error = {"type": "server_error", "code": "upstream_error", "message": message}
    return _event("error", {"type": "error", "code": "upstream_error", "message": message, "param": None,
                            "error": error})


def error_event_for(route: Route) -> ErrorEvent:
    """The event that ends a cut stream on `route`."""
    if route in ANTHROPIC_ROUTES:
        return anthropic_error_event
    if route is Route.RESPONSES:
        return responses_error_event
    return sse_error_event

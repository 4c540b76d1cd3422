"""OpenAI-shaped errors: one exception type for the request path, and its JSON and SSE renderings.

Clients of an OpenAI-compatible API parse `{"error": {"message", "type", "param", "code"}}`; every error the
router produces itself (bad input, auth, unknown model, no pod up) uses that shape so SDKs surface the
message instead of a parse failure. Upstream errors are passed through untouched and never re-shaped.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
UNAVAILABLE = "service_unavailable_error"
SERVER = "server_error"


class ApiError(Exception):
    """An error answered to the client with `status` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.counted = False  # already counted in requests_total

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={**self.headers, **(headers or {})})


class ClientGone(ApiError):
    """The client closed the connection before its body was read: nobody to answer, nothing wrong with
    the gateway (counted as a client disconnect and logged at INFO, not as an unhandled error)."""

    def __init__(self) -> None:
        super().__init__(499, "The client closed the connection before sending the whole request body.",
                         code="client_disconnected")


def error_body(
    message: str, *, type: str = INVALID_REQUEST, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def sse_error_event(message: str, *, type: str = SERVER, code: str | None = "upstream_error") -> bytes:
    """An SSE event ending a stream that failed midway, so clients stop waiting instead of hanging.

    The leading blank line terminates whatever partial event the upstream left half-written."""
    payload = json.dumps(error_body(message, type=type, code=code), separators=(",", ":"))
    return b"\n\ndata: " + payload.encode() + b"\n\n"


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model `{model}` does not exist or is not served by this fleet.",
        type=INVALID_REQUEST, code="model_not_found", param="model",
    )


def no_pod_available(model: str) -> ApiError:
    return ApiError(
        503, f"No pod serving `{model}` is available right now; retry later.",
        type=UNAVAILABLE, code="no_pod_available", headers={"retry-after": "1"},
    )

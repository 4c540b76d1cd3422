"""The agent API's request bodies, and reading them safely: size first, then pydantic validation.

Split from app.py so the routes read as routes. A body over the limit is refused by its Content-Length
and, for chunked bodies, by counting, before anything is parsed; an invalid one is a 400 naming the
first problem. Errors have one JSON shape, `{"error": {"kind", "reason"}}`, which the router's agent
client reads.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from llamafleet_agent.store import Refused

M = TypeVar("M", bound=BaseModel)


class SaveBody(BaseModel):
    slot: int = Field(ge=0)
    name: str
    pinned: bool = False
    blocks: list[str] | None = None
    block_chars: int = Field(default=0, ge=0)
    tokens: list[int] | None = None
    n_chars: int = Field(default=0, ge=0)
    text_hash: str = Field(default="", max_length=64, pattern=r"^[0-9a-f]*$")


class PullBody(BaseModel):
    name: str
    source: str
    pinned: bool | None = None


class RequiredBody(BaseModel):
    snapshots: list[str]


class RestoreBody(BaseModel):
    slot: int = Field(ge=0)


def error_response(status: int, kind: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "reason": reason}}, status_code=status)


async def read_json(request: Request, model: type[M], limit: int) -> M:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Refused("body", f"request body over {limit} bytes", 413)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise Refused("body", f"request body over {limit} bytes", 413)
    try:
        return model.model_validate_json(bytes(data))
    except ValidationError as exc:
        raise Refused("body", f"invalid request body: {exc.errors()[0].get('msg', '')}", 400) from exc

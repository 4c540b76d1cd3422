"""Structured JSON logs with the request id of the request being served.

The request id lives in a ContextVar set by the request-id middleware, so every log line emitted while
serving a request (and in tasks spawned from it, which copy the context) carries it without threading it
through every call. Call sites pass only safe fields in `extra=`: never API keys, never prompt text.

The request id is the gateway's own, unique per request: it names the request's slot lease, its
snapshot flights and the upstream `x-request-id`, so two requests can never be taken for one. The id a
client sent (`x-request-id`, reused by retries and sessions) is logged beside it as `client_request_id`,
and echoed back, and used for nothing else.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import orjson

request_id_var: ContextVar[str | None] = ContextVar("llamafleet_request_id", default=None)
client_request_id_var: ContextVar[str | None] = ContextVar("llamafleet_client_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the process's own `fields` (a worker's index),
    request_id (and client_request_id), then the `extra=` fields."""

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self._fields,
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
            if (client_id := client_request_id_var.get()) is not None:
                entry["client_request_id"] = client_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(entry, default=str).decode()  # ~5x cheaper than json on every request
        except (TypeError, orjson.JSONEncodeError):  # e.g. a non-str key in a field: the slow, lenient way
            return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO", fields: Mapping[str, Any] | None = None) -> None:
    """Route the `llamafleet_router` loggers (and uvicorn's) through one JSON handler on stderr; every
    line carries `fields` (the workers of one pod share its log stream: each names itself)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(fields))
    for name in ("llamafleet_router", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(level.upper())

"""A logger for reconcile functions that also posts each message as a Kubernetes event on the object.

kopf posts events only when asked (`kopf.event`; its logger-to-event bridge is off by default since it
would post kopf's own per-tick "timer succeeded" lines too). Reconcile functions log only what changed,
so every line they log at INFO or above is an event worth seeing in `kubectl describe`.
"""

from __future__ import annotations

from typing import Any

import kopf


class EventLogger:
    def __init__(self, body: kopf.Body, logger: kopf.Logger, reason: str) -> None:
        self._body = body
        self._logger = logger
        self._reason = reason

    def _post(self, type_: str, message: str) -> None:
        kopf.event(self._body, type=type_, reason=self._reason, message=message)

    def debug(self, message: str, *args: Any) -> None:
        self._logger.debug(message, *args)

    def info(self, message: str, *args: Any) -> None:
        self._logger.info(message, *args)
        self._post("Normal", message % args if args else message)

    def warning(self, message: str, *args: Any) -> None:
        self._logger.warning(message, *args)
        self._post("Warning", message % args if args else message)

    def error(self, message: str, *args: Any) -> None:
        self._logger.error(message, *args)
        self._post("Warning", message % args if args else message)

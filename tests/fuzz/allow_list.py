"""The fuzzers' forwarded-fields check: what reached a pod carries only fields its route allows.

The allow-list is the gateway's own (`api/fields.py`, `FieldPolicy.allowed`, extended by the settings'
`extra_fields`), imported rather than copied, so the check follows it wherever it goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llamafleet_router.api.fields import FieldPolicy
from llamafleet_router.api.parse import Route
from llamafleet_router.settings import RouterSettings

ROUTES = {route.value: route for route in Route}


def off_the_list(
    forwarded: Iterable[tuple[str, Any]], settings: RouterSettings, key: str,
) -> list[tuple[str, list[str]]]:
    """(path, fields) of each forwarded (path, body) whose body has a top-level field its route does not
    allow `key`; a body that is not a JSON object counts as one with the field `<not an object>`.
    Paths that are no inference route (discovery's polls) are not bodies of a client's request."""
    policy = FieldPolicy.from_settings(settings)
    found: list[tuple[str, list[str]]] = []
    for path, body in forwarded:
        route = ROUTES.get(path)
        if route is None:
            continue
        if not isinstance(body, dict):
            found.append((path, ["<not an object>"]))
            continue
        extra = sorted(name for name in body if name not in policy.allowed(route, key))
        if extra:
            found.append((path, extra))
    return found

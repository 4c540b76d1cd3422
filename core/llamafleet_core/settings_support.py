"""What the router's and the operator's settings share: a checked Redis URL type, and settings errors
for people (one line per bad field, never the value that was given: pydantic's own text repeats each
input, and a Redis URL or a token carries a password, which a start-up error would then print to a
terminal or a pod's log).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, ValidationError

from llamafleet_core.index.resp import Address


def _redis_url(value: str) -> str:
    Address.from_url(value)  # the index's own client: a URL it cannot use fails at start, by name
    return value


RedisUrl = Annotated[str, AfterValidator(_redis_url)]


def describe(exc: ValidationError) -> str:
    """`field: message` per error, without the input values."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in err["loc"]) or "(settings)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)

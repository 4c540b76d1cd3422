"""Settings errors for people: one line per bad field, never the value that was given.

pydantic's own text repeats each input value, and a Redis URL or a token carries a password, which a
start-up error would then print to a terminal or a pod's log.
"""

from __future__ import annotations

from pydantic import ValidationError


def describe(exc: ValidationError) -> str:
    """`field: message` per error, without the input values."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in err["loc"]) or "(settings)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)

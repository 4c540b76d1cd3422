"""How deep a JSON body nests objects and arrays, bounded before anything walks it recursively.

A tool schema nested 500 deep took the encoder past Python's recursion limit, so `shapes.py` refuses a
body deeper than the gateway's bound. The walk is level by level (no recursion), and a body's learned
tools (`known_tools.py`), whose depth was measured once, are not walked again. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def _levels(value: Any) -> Iterator[list[Any]]:
    """The objects and arrays of `value`, level by level (`value` itself first), each level built only
    when the one before it was read."""
    level = [value] if type(value) is dict or type(value) is list else []
    while level:
        yield level
        level = [child for item in level for child in (item.values() if type(item) is dict else item)
                 if type(child) is dict or type(child) is list]


def depth(value: Any) -> int:
    """How many levels `value` nests objects and arrays (a scalar 0, `[]` 1): `too_deep` counted out."""
    return sum(1 for _ in _levels(value))


def too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels (the body itself is level 1,
    never too deep by itself); it stops at the first level too deep."""
    return any(n > max(limit, 1) for n, _ in enumerate(_levels(value), 1))


def body_too_deep(body: Mapping[str, Any], limit: int, known_tools: tuple[Any, int] | None) -> bool:
    """`too_deep(body, limit)`, where `known_tools` (a tools value and its `depth`), when it is the
    body's `tools`, is counted by its known depth instead of walked."""
    if known_tools is None or body.get("tools") is not known_tools[0]:
        return too_deep(body, limit)
    # The body is level 1, so its tools' own levels start at 2.
    return 1 + known_tools[1] > limit or too_deep({k: v for k, v in body.items() if k != "tools"}, limit)

"""Value printing of llama.cpp's Jinja engine (`common/jinja/value.cpp`), so renders match byte for byte.

- `tojson`: separators `", "` and `": "` (or `","` with an indent), keys in insertion order, only `"`,
  `\\`, and control characters escaped (non-ASCII kept unless `ensure_ascii`), floats printed by a C++
  stream (`%g`: 3.0 -> `3`, 0.1234567 -> `0.123457`), booleans `true`/`false`, none `null`.
- `{{ x }}` and `x|string`: booleans `True`/`False`, floats like `std::to_string` without trailing zeros
  (1.5 -> `1.5`, 2.0 -> `2.0`), lists and dicts in Python-repr style.

The fast path uses the C JSON encoder, whose output is the same as llama.cpp's except for floats and
lone surrogates, so values holding neither (almost all tool schemas) never walk the tree in Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

_FAST = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), check_circular=False, allow_nan=True)
_ENC_STR = json.encoder.encode_basestring  # type: ignore[attr-defined]
_ENC_STR_ASCII = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


class PrecomputedJson(dict):  # type: ignore[type-arg]
    """A dict that carries its own `tojson` text, computed once (the tool schemas: most of a prompt)."""

    __slots__ = ("json_text",)

    def __init__(self, value: dict[str, Any]) -> None:
        super().__init__(value)
        self.json_text = llama_tojson(value)


def _cpp_float(value: float) -> str:
    """`std::ostream << double` with the default precision (6 significant digits, %g)."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return f"{value:g}"


def _needs_slow(value: Any) -> bool:
    """Whether the C encoder's output would differ from llama.cpp's (floats, odd types or keys)."""
    stack = [value]
    pop, push = stack.pop, stack.extend
    while stack:
        v = pop()
        kind = type(v)
        if kind is str or kind is int or kind is bool or v is None:
            continue
        if kind is dict:
            push(v.values())
            if not all(type(k) is str for k in v):
                return True
        elif kind is list:
            push(v)
        else:
            return True  # floats, tuples, other mappings: the exact (slow) encoder handles them
    return False


def _encode(value: Any, indent: int, item_sep: str, key_sep: str, level: int, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_cpp_float(value))
    elif isinstance(value, str):
        out.append(_ENC_STR(value))
    elif isinstance(value, (list, tuple, Mapping)):
        is_map = isinstance(value, Mapping)
        items: list[Any] = list(value.items()) if is_map else list(value)  # type: ignore[union-attr]
        out.append("{" if is_map else "[")
        if items:
            nl = "\n" if indent >= 0 else ""
            pad = " " * (indent * (level + 1)) if indent > 0 else ""
            out.append(nl)
            for i, item in enumerate(items):
                out.append(pad)
                if is_map:
                    out.append(_ENC_STR(str(item[0])))
                    out.append(key_sep)
                    _encode(item[1], indent, item_sep, key_sep, level + 1, out)
                else:
                    _encode(item, indent, item_sep, key_sep, level + 1, out)
                if i < len(items) - 1:
                    out.append(item_sep)
                out.append(nl)
            out.append(" " * (indent * level) if indent > 0 else "")
        out.append("}" if is_map else "]")
    else:
        out.append("null")


def llama_tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """The `tojson` filter/function of llama.cpp's Jinja engine."""
    if sort_keys:
        raise ValueError("tojson sort_keys=true not implemented")  # as llama.cpp
    if type(value) is PrecomputedJson and not ensure_ascii and indent is None and separators is None:
        return value.json_text
    ind = indent if isinstance(indent, int) and not isinstance(indent, bool) else -1
    seps = list(separators) if isinstance(separators, (list, tuple)) else []
    item_sep = str(seps[0]) if len(seps) > 0 else (", " if ind < 0 else ",")
    key_sep = str(seps[1]) if len(seps) > 1 else ": "
    if ind < 0 and item_sep == ", " and key_sep == ": " and not _needs_slow(value):
        text = _FAST.encode(value)
    else:
        out: list[str] = []
        _encode(value, ind, item_sep, key_sep, 0, out)
        text = "".join(out)
    if ensure_ascii:
        text = _ascii_escape_strings(text)
    return text


def _ascii_escape_strings(text: str) -> str:
    """Escape non-ASCII only inside strings, keeping the layout (`json_ensure_ascii_preserving_format`)."""
    if text.isascii():
        return text
    return "".join(_ENC_STR_ASCII(ch)[1:-1] if ord(ch) > 0x7F else ch for ch in text)


def llama_str(value: Any) -> Any:
    """How llama.cpp turns a value into text for output, `|string` and `|safe`."""
    if isinstance(value, str):
        return str(value)
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return _cpp_float(value)
        out = f"{value:f}".rstrip("0")
        return out + "0" if out.endswith(".") else out
    if isinstance(value, (list, tuple, Mapping)):
        return _repr(value)
    return str(value)


def _repr(value: Any) -> str:
    if isinstance(value, str):
        return llama_tojson(value) if "'" in value else f"'{value}'"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_repr(k)}: {_repr(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_repr(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_repr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    out = llama_str(value)
    return out if isinstance(out, str) else str(out)

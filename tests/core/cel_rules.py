"""The CRDs' `x-kubernetes-validations`, evaluated the way the API server does it, with cel-python.

The API server first applies the schema's defaults, then evaluates every rule at every node that is
present, with `self` bound to that node's value; an evaluation error is a rejection too (here: a raise).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import celpy

JSON = dict[str, Any]
_MACROS = ("all", "exists", "exists_one", "map", "filter")
_STRING_FUNCTIONS = ("matches", "contains", "startsWith", "endsWith", "split", "replace", "indexOf",
                     "lowerAscii", "upperAscii", "find", "findAll")
_CALL = re.compile(r"\bself((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\.([A-Za-z_]+)\(")


@dataclass(frozen=True)
class Rule:
    path: str
    """Where the rule sits, as a dotted path of property names (`[]` for list items)."""
    rule: str
    message: str
    field_path: str | None
    node: JSON = field(repr=False, compare=False)
    """The schema node the rule sits on (what `self` is)."""


def rules(schema: JSON, path: str = "") -> Iterator[Rule]:
    for item in schema.get("x-kubernetes-validations") or []:
        yield Rule(path, item["rule"], item["message"], item.get("fieldPath"), schema)
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from rules(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules(schema["additionalProperties"], f"{path}{{}}")


def with_defaults(schema: JSON, value: Any) -> Any:
    """`value` with the schema's defaults filled in wherever its parent object is present (pure)."""
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


def _default(schema: JSON, value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in (schema.get("properties") or {}):
                    _default(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


class Evaluator:
    """Every rule of one schema, compiled once."""

    def __init__(self, schema: JSON) -> None:
        self.schema = schema
        self.env = celpy.Environment()
        self.programs: dict[str, Any] = {}
        for rule in rules(schema):
            self.programs[rule.rule] = self.env.program(self.env.compile(rule.rule))

    def violations(self, value: Any) -> list[str]:
        """Messages of the rules `value` breaks (no defaulting here: call `with_defaults` first)."""
        out: list[str] = []
        self._walk(self.schema, value, out)
        return out

    def _walk(self, schema: JSON, value: Any, out: list[str]) -> None:
        for item in schema.get("x-kubernetes-validations") or []:
            verdict = self.programs[item["rule"]].evaluate({"self": celpy.json_to_cel(value)})
            if not isinstance(verdict, celpy.celtypes.BoolType):
                raise AssertionError(f"rule {item['rule']!r} gave {verdict!r}, not a bool")
            if not verdict:
                out.append(item["message"])
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            for name, sub in props.items():
                if name in value:
                    self._walk(sub, value[name], out)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for key, sub_value in value.items():
                    if key not in props:
                        self._walk(extra, sub_value, out)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for item_value in value:
                self._walk(schema["items"], item_value, out)


def node_at(schema: JSON, path: str) -> JSON:
    """The schema node a rule's `self.a.b` (relative `path` `.a.b`) names."""
    node = schema
    for part in [p for p in path.split(".") if p]:
        node = node["properties"][part]
    return node


def unbounded_calls(schema: JSON) -> list[str]:
    """Rules that iterate a list or map, or call a string function, on a node without a size bound:
    the API server's cost estimate assumes the largest possible size there and refuses such a CRD."""
    problems = []

    def visit(node: JSON, where: str) -> None:
        for item in node.get("x-kubernetes-validations") or []:
            for match in _CALL.finditer(item["rule"]):
                target, function = node_at(node, match.group(1)), match.group(2)
                if function in _MACROS and not ({"maxItems", "maxProperties"} & set(target)):
                    problems.append(f"{where}: {item['rule']!r}: self{match.group(1)} has no maxItems")
                if function in _STRING_FUNCTIONS and "maxLength" not in target:
                    problems.append(f"{where}: {item['rule']!r}: self{match.group(1)} has no maxLength")
        for name, sub in (node.get("properties") or {}).items():
            visit(sub, f"{where}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                visit(node[key], f"{where}[]")

    visit(schema, "")
    return problems

"""Turn a pydantic JSON schema into a Kubernetes structural schema (apiextensions.k8s.io/v1).

The API server accepts only structural schemas: every node has a `type` (or one of the two escape
hatches below), there are no `$ref`s, and `anyOf`/`oneOf` may only restate constraints, never types.
Pydantic's output differs in a few regular ways, each fixed here:

- `$ref` into `$defs`: inlined.
- `X | None` is `anyOf: [X, {type: null}]`: the null branch is dropped. The API server prunes nulls of
  non-nullable fields, so leaving an optional field out and writing `null` mean the same thing.
- `int | str` (quantities) is `anyOf: [integer, string]`: becomes `x-kubernetes-int-or-string: true`.
- free-form JSON (`dict[str, Any]`, `Any`): becomes `x-kubernetes-preserve-unknown-fields: true`, else the
  API server would prune every key of a tool schema.
- `title`, `additionalProperties: false` and `default: null` are dropped; `const` becomes a one-value `enum`.
"""

from __future__ import annotations

import copy
from typing import Any

JSON = dict[str, Any]

_DROP = frozenset({"title", "$defs", "discriminator"})
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def structural(schema: JSON) -> JSON:
    """The structural form of a pydantic `model_json_schema()` result (which is not modified)."""
    defs: dict[str, JSON] = schema.get("$defs", {})
    return _convert(copy.deepcopy(schema), defs)


def _resolve(node: JSON, defs: dict[str, JSON]) -> JSON:
    ref = node.get("$ref")
    if ref is None:
        return node
    target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
    # Keys beside a $ref (description, default) describe this use of the type and win over the type's own.
    target.update({k: v for k, v in node.items() if k != "$ref"})
    return _resolve(target, defs)


def _merge_any_of(node: JSON, defs: dict[str, JSON]) -> JSON:
    branches = [_resolve(b, defs) for b in node.pop("anyOf")]
    branches = [b for b in branches if b.get("type") != "null"]
    types = sorted(b.get("type", "") for b in branches)
    if types == ["integer", "string"]:
        node["x-kubernetes-int-or-string"] = True
        node["anyOf"] = copy.deepcopy(_INT_OR_STRING)
        # Value constraints of the string branch (a quantity's pattern) apply to strings only.
        for branch in branches:
            if branch.get("type") == "string" and "pattern" in branch:
                node["pattern"] = branch["pattern"]
        return node
    if len(branches) != 1:
        raise ValueError(f"cannot express anyOf with types {types} in a structural schema")
    merged = dict(branches[0])
    merged.update(node)
    return merged


def _convert(node: JSON, defs: dict[str, JSON]) -> JSON:
    node = _resolve(node, defs)
    if "anyOf" in node:
        node = _merge_any_of(node, defs)
        if "x-kubernetes-int-or-string" in node:
            return {k: v for k, v in node.items() if k not in _DROP and not (k == "default" and v is None)}
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _resolve(node.pop("allOf")[0], defs)
        node = {**inner, **node}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    out: JSON = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out[key] = _convert(value, defs)
            elif value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # `false` is the default for a structural object with properties: drop it.
        else:
            out[key] = value
    if "type" not in out and "x-kubernetes-preserve-unknown-fields" not in out:
        # `Any`: free-form JSON of any shape.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"])
    return _ordered(out)


_FIRST = ("description", "type", "format", "enum", "default", "minimum", "maximum", "minLength", "maxLength",
          "pattern", "required", "properties", "items", "additionalProperties")


def _ordered(node: JSON) -> JSON:
    """Readable, stable key order in the YAML: what a node is first, then its children, extensions last."""
    keys = [k for k in _FIRST if k in node] + sorted(k for k in node if k not in _FIRST)
    return {k: node[k] for k in keys}


def _enum_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) for v in values):
        return "integer"
    return "string"

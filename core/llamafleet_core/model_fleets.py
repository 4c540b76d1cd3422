"""`model=namespace/name` entries: which fleet serves a model name that several fleets report.

One setting on both sides, from one chart value (`gateway.modelFleets`): the gateway routes such a name
to the fleet named here only (its `ownership.py`), and the operator reports the names that no entry
resolves in each fleet's status (`ModelConflict`). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_model_fleets(entries: Iterable[str]) -> dict[str, str]:
    """`model=namespace/name` entries as {model: fleet}; ValueError naming a malformed or repeated one."""
    mapping: dict[str, str] = {}
    for text in entries:
        model, sep, fleet = (part.strip() for part in text.partition("="))
        namespace, slash, name = fleet.partition("/")
        if not sep or not model or not slash or not namespace or not name or "/" in name:
            raise ValueError(f"a model's fleet must be `model=namespace/name`: {text!r}")
        if model in mapping and mapping[model] != fleet:
            raise ValueError(f"model {model!r} is mapped to two fleets: {mapping[model]!r} and {fleet!r}")
        mapping[model] = fleet
    return mapping

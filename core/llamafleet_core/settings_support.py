"""What the router's and the operator's settings share: a checked Redis URL type, and settings errors
for people (one line per bad field, never the value that was given: pydantic's own text repeats each
input, and a Redis URL or a token carries a password, which a start-up error would then print to a
terminal or a pod's log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, SecretStr, ValidationError
from pydantic_settings import NoDecode

from llamafleet_core.index.cluster import is_cluster_url, parse_cluster_url
from llamafleet_core.index.resp import Address
from llamafleet_core.model_fleets import parse_model_fleets
from llamafleet_core.networks import check_networks, split_list


def _redis_url(value: str) -> str:
    # The index's own client: a URL it cannot use fails at start, by name.
    if is_cluster_url(value):
        parse_cluster_url(value)
    else:
        Address.from_url(value)
    return value


RedisUrl = Annotated[str, AfterValidator(_redis_url)]


def _model_fleets(value: list[str]) -> list[str]:
    parse_model_fleets(value)
    return value


# Lists given as comma-separated text in the environment (or as lists), each entry checked at start.
NetworkList = Annotated[list[str], NoDecode, BeforeValidator(split_list), AfterValidator(check_networks)]
ModelFleetList = Annotated[list[str], NoDecode, BeforeValidator(split_list), AfterValidator(_model_fleets)]


def describe(exc: ValidationError) -> str:
    """`field: message` per error, without the input values."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in err["loc"]) or "(settings)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def secret_text(value: SecretStr | None, path: Path | None) -> str:
    """A secret setting: `value` when set and not empty, else the first line of the file `path`, else ""."""
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    if path is not None:
        lines = path.read_text().strip().splitlines()
        return lines[0].strip() if lines else ""
    return ""

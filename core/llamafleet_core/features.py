"""What a llama-server build can do, read from its `--help` text (pure).

Patched builds of the prefix-sharing proposal add `--slot-attach` (a slot shares another slot's prefix KV
through `seq_cp`; hybrid models attach at checkpoints) and `--cache-prefix` (a persistent RAM cache entry
cut at the first user message). Upstream llama-server has neither and refuses to start on an unknown
flag, so a flag may only be rendered where the build is known to accept it. The help text is the one
description every build carries, needs no model and no GPU, and is the same on every pod of an image, so
it is read once per image: by an init container in a cluster (the agent reports it), by `llamafleet up`
directly on one machine.

Parsing reads only the spelling column of each option (what precedes the description), so a flag named
in another option's description ("Complements --cpu-mask") is not mistaken for one the build defines.
Environment names (`(env: LLAMA_ARG_...)`) count too: a build may document a feature only by its variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Feature -> the spellings (flags or env variables) that reveal it.
FEATURE_FLAGS: dict[str, tuple[str, ...]] = {
    "slot_attach": ("--slot-attach", "LLAMA_ARG_SLOT_ATTACH"),
    "cache_prefix": ("--cache-prefix", "LLAMA_ARG_CACHE_PREFIX"),
    "slot_checkpoints": ("--slot-save-checkpoints", "LLAMA_ARG_SLOT_SAVE_CHECKPOINTS"),
}
# Options every llama-server since 2024 defines: text without them is not llama-server's help (a shell
# error, a missing library, the wrong binary), and then nothing is known rather than "nothing supported".
SIGNATURE = frozenset({"--ctx-size", "--slot-save-path"})

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_ENV = re.compile(r"\benv:\s*([A-Z][A-Z0-9_]+)")
# The spelling column ends where the description starts: a tab, or two spaces not after a comma (the
# aliases of one option are padded apart: `-fa,   --flash-attn`).
_COLUMN_END = re.compile(r"(?<![,\s])\s{2,}|\t")
_MAX_INDENT = 6


@dataclass(frozen=True)
class ServerFeatures:
    """The prefix-sharing features of one llama-server build, and every option it defines."""

    slot_attach: bool = False
    cache_prefix: bool = False
    slot_checkpoints: bool = False  # `--slot-save-checkpoints`: slot files carry context checkpoints
    flags: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    """Every flag and env variable the help defines (for checks beyond the named features; two builds
    with the same features compare equal whatever else they define)."""

    def has(self, spelling: str) -> bool:
        return spelling in self.flags

    def to_json(self) -> dict[str, bool]:
        """The camelCase form the agent reports and the fleet status records."""
        return {"slotAttach": self.slot_attach, "cachePrefix": self.cache_prefix,
                "slotCheckpoints": self.slot_checkpoints}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerFeatures:
        return cls(slot_attach=bool(data.get("slotAttach")), cache_prefix=bool(data.get("cachePrefix")),
                   slot_checkpoints=bool(data.get("slotCheckpoints")))


def spellings(help_text: str) -> frozenset[str]:
    """Every flag in the spelling column of an option line, and every `env:` variable (pure)."""
    found: set[str] = set()
    for raw in _ANSI.sub("", help_text).splitlines():
        found.update(_ENV.findall(raw))
        line = raw.rstrip().replace("`", "")
        if line.startswith("|"):  # a Markdown table (the server README's format): the first cell
            line = line.strip("| ").split(" |", 1)[0]
        # Option lines start at (or near) the margin; descriptions are indented far to the right.
        if len(line) - len(line.lstrip()) > _MAX_INDENT or not line.lstrip().startswith("-"):
            continue
        column = _COLUMN_END.split(line.strip(), maxsplit=1)[0]
        found.update(_FLAG.findall(column))
    return frozenset(found)


def parse_help(help_text: str) -> ServerFeatures | None:
    """The features `llama-server --help` reveals; None when the text is not llama-server's help."""
    found = spellings(help_text)
    if not found >= SIGNATURE:
        return None
    named = {name: any(s in found for s in names) for name, names in FEATURE_FLAGS.items()}
    return ServerFeatures(flags=found, **named)


def summary(features: ServerFeatures | None) -> str:
    """One line for logs and status messages."""
    if features is None:
        return "unknown (no llama-server help text)"
    on = [name for name in FEATURE_FLAGS if getattr(features, name)]
    return ", ".join(on) if on else "none of " + ", ".join(FEATURE_FLAGS)

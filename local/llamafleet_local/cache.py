"""Where the local tool bed keeps what it builds and generates (outside any checkout)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_CACHE = "LLAMAFLEET_CACHE"


def cache_root() -> Path:
    """`$LLAMAFLEET_CACHE`, else `$XDG_CACHE_HOME/llamafleet`, else `~/.cache/llamafleet`."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamafleet"


def log(message: str) -> None:
    """Progress for long local steps goes to stderr so stdout stays machine-readable."""
    print(f"[llamafleet] {message}", file=sys.stderr, flush=True)

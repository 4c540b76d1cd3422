"""The `llamafleet` command: a thin shell that dispatches to each component's own `main(argv)`.

Components are imported only when their subcommand runs, so `llamafleet agent` in a pod never imports
the router or kopf, and the import rules between components hold at run time too. A subcommand whose
package is not installed (the test bed's, in the pod image) says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module with `main(argv) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "router": ("llamafleet_router.cli", "run the prefix-aware OpenAI-compatible gateway"),
    "agent": ("llamafleet_agent.cli", "run the snapshot agent beside one llama-server"),
    "operator": ("llamafleet_operator.cli", "run the Kubernetes operator (LlamaFleet, SharedPrefix)"),
    "up": ("llamafleet_local.up", "run a FLEET.yaml (index, llama-server + agent pods, gateway) locally"),
    # The test bed's (llamafleet-testbed, a distribution of its own: absent from the pod image)
    "demo": ("llamafleet_testbed.demo",
             "replay agent sessions through a local fleet and a plain llama-server"),
    "bench": ("llamafleet_testbed.bench",
              "the seed table: llamafleet against llama-server and sglang-router"),
    "build-server": ("llamafleet_testbed.llama_build", "build (or find) the llama-server binary"),
    "models": ("llamafleet_testbed.named_models", "write (or find) the tiny models; fetch the real ones"),
    "helm": ("llamafleet_testbed.helm", "fetch (or find) the helm, kubectl and hadolint binaries"),
    "reliability": ("llamafleet_testbed.reliability", "run the fault scenarios and print their figures"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamafleet",
        description="Prefix-aware gateway, snapshot agent and operator for llama-server fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not args or args[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        parser.print_usage(sys.stderr)
        print(f"llamafleet: unknown command {command!r}", file=sys.stderr)
        return 2
    module_name = COMMANDS[command][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(f"llamafleet {command}: not available in this installation ({exc})", file=sys.stderr)
        return 2
    entry: Callable[[list[str]], int] = module.main
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

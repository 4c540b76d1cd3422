"""`llamafleet operator ...`: run the kopf operator for LlamaFleet and SharedPrefix.

One replica, standalone, by default: deploy it as a single-replica Deployment with the Recreate strategy.
The reconcile is level-based and idempotent, so the only cost of a brief overlap of two
operators (during a node failure) is duplicate work, never a wrong result; and standalone needs neither
kopf's peering CRDs nor the RBAC to write them. For a hot standby, `--peering NAME` turns on kopf's
peering: every replica runs, the one with the highest `--priority` acts and the others pause (this needs
the `KopfPeering`/`ClusterKopfPeering` CRDs installed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import kopf
from pydantic import ValidationError

from llamafleet_core.settings_support import describe
from llamafleet_operator.handlers import register
from llamafleet_operator.settings import OperatorSettings


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, OperatorSettings]:
    parser = argparse.ArgumentParser(prog="llamafleet operator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--namespace", action="append", default=None,
                        help="namespace to serve (repeatable, globs allowed); default: all namespaces")
    parser.add_argument("--redis-url", default=None, help="prefix index and fleet membership")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument("--peering", default=None, metavar="NAME",
                        help="use kopf peering NAME for leader election instead of running standalone")
    parser.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    parser.add_argument("--liveness", default=None, metavar="URL",
                        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(list(argv))
    overrides = {k: v for k, v in {"namespaces": args.namespace, "redis_url": args.redis_url,
                                   "kubeconfig": args.kubeconfig}.items() if v is not None}
    return args, OperatorSettings(**overrides)


async def run(args: argparse.Namespace, settings: OperatorSettings,
              stop: asyncio.Event | None = None) -> None:
    registry = register(kopf.OperatorRegistry(), settings)
    await kopf.operator(
        registry=registry,
        memo=kopf.Memo(settings=settings),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=args.liveness,
        stop_flag=stop,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, settings = parse(sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        print(f"llamafleet operator: invalid settings:\n{describe(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"llamafleet operator: {exc}", file=sys.stderr)
        return 2
    kopf.configure(verbose=args.verbose)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(run(args, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())

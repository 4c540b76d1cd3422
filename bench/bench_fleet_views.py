"""The router's per-request views of the fleet (`fleet.state.endpoint_states`) at fleet scale.

Every request builds the scheduler's view of every pod of its model. Until issue 25 each view walked
every slot this gateway had a request pinned to, in the whole fleet, to find the pod's own: O(pods x
pinned slots) per request. Now the books are per pod and a pod's view is kept until a request begins or
ends on it. The baseline here is that walk, rebuilt from the same books in the same process; between
two calls one request ends on one pod and another begins on another, as between two requests.

The second part times the request's whole read of the fleet as the director makes it: static
discovery's list (pods polled through its real code, on a mock transport), the model's owners, then the
views. Its baseline is the same discovery building every pod's status anew per request, as it did
before its statuses were kept: a new status is a new view to build, so nothing kept could be reused.

    .venv/bin/python bench/bench_fleet_views.py [--pods 1000] [--slots 4] [--busy 0.5] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from llamafleet_core import http_pool
from llamafleet_core.types import Endpoint, PodRef
from llamafleet_router.discovery.base import PodProps, PodStatus
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.fleet.ownership import ModelOwners
from llamafleet_router.fleet.state import InFlight, endpoint_states
from llamafleet_router.metrics import RouterMetrics
from llamafleet_router.scheduling.framework import EndpointState

MODEL = "m"
HERE = Path(__file__).resolve().parent


def walk_every_pinned_slot(pods: list[PodStatus], flight: InFlight, pinned: Counter[tuple[str, int]],
                           ) -> list[EndpointState]:
    """The views as built before: per pod, a pass over every pinned slot of the fleet."""
    out = []
    for pod in pods:
        uid = pod.endpoint.uid
        requests = {slot: n for (owner, slot), n in pinned.items() if owner == uid and n > 0}
        out.append(EndpointState(endpoint=pod.endpoint, busy_slots=frozenset(requests),
                                 slot_last_used=flight.last_used(uid), slot_requests=requests,
                                 in_flight=flight.count(uid), healthy=True))
    return out


def answer(n_slots: int) -> httpx.MockTransport:
    """Every pod's /health, /props and /slots, as llama-server answers them."""
    props = {"total_slots": n_slots, "model_alias": MODEL, "default_generation_settings": {"n_ctx": 4096}}
    slots = [{"id": i, "n_ctx": 4096, "is_processing": False} for i in range(n_slots)]

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        return httpx.Response(200, json={"status": "ok"} if path == "/health" else
                              props if path == "/props" else slots)
    return httpx.MockTransport(handle)


async def request_path(args: argparse.Namespace, rng: random.Random) -> dict[str, list[float]]:
    """The director's read per request (`Director.pods`, then `endpoint_states`), statuses kept or not."""
    times: dict[str, list[float]] = {"every status built anew (before)": [], "statuses kept (now)": []}
    async with http_pool.async_client(transport=answer(args.slots)) as http:
        specs = [PodSpec.parse(f"http://p{i}:8080") for i in range(args.pods)]
        disc = StaticDiscovery(specs, http, poll_interval=3600)
        await disc.poll_once()
        owners, flight = ModelOwners(), InFlight(RouterMetrics(CollectorRegistry()))
        uids = [pod.endpoint.uid for pod in await disc.endpoints()]
        for _ in range(args.calls):
            uid = rng.choice(uids)  # a request begins on a pod, as between two requests
            flight.begin(uid, uid, rng.randrange(args.slots))
            for name in times:
                if name.startswith("every"):
                    for pod in disc._pods:  # what `endpoints()` did before: no status kept
                        pod.status = None
                started = time.perf_counter()
                endpoint_states(MODEL, owners.pick(MODEL, await disc.endpoints()), flight)
                times[name].append((time.perf_counter() - started) * 1000)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--busy", type=float, default=0.5, help="share of the fleet's slots with a request")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", type=Path, default=HERE / "results" / "fleet_views.json")
    args = p.parse_args()
    rng = random.Random(25)
    pods = [PodStatus(Endpoint(PodRef(f"p{i}", f"u{i}", 1), f"http://p{i}:8080", MODEL, args.slots),
                      PodProps(MODEL, args.slots)) for i in range(args.pods)]
    flight = InFlight(RouterMetrics(CollectorRegistry()))
    pinned: Counter[tuple[str, int]] = Counter()
    every = [(pod.endpoint.uid, s) for pod in pods for s in range(args.slots)]
    running = rng.sample(every, int(len(every) * args.busy))
    idle = sorted(set(every) - set(running))
    for uid, slot in running:
        flight.begin(uid, uid, slot)
        pinned[(uid, slot)] += 1
    times: dict[str, list[float]] = {"walk every pinned slot (before)": [], "kept views (now)": []}
    for _ in range(args.calls):
        done = running.pop(rng.randrange(len(running)))  # one request ends, another begins
        flight.end(done[0], done[0], done[1])
        pinned[done] -= 1
        nxt = idle.pop(rng.randrange(len(idle)))
        flight.begin(nxt[0], nxt[0], nxt[1])
        pinned[nxt] += 1
        running.append(nxt)
        idle.append(done)
        for name, build in (("walk every pinned slot (before)", lambda: walk_every_pinned_slot(
                pods, flight, pinned)), ("kept views (now)", lambda: endpoint_states(MODEL, pods, flight))):
            started = time.perf_counter()
            build()
            times[name].append((time.perf_counter() - started) * 1000)
    before, now = (statistics.median(t) for t in times.values())
    path = asyncio.run(request_path(args, rng))
    path_before, path_now = (statistics.median(t) for t in path.values())
    result = {"pods": args.pods, "slots": args.slots, "pinned_slots": len(running), "calls": args.calls,
              "p50_ms": {k: statistics.median(v) for k, v in times.items()},
              "p99_ms": {k: sorted(v)[int(len(v) * 0.99) - 1] for k, v in times.items()},
              "before_over_now_p50": before / now,
              "request_path": {"p50_ms": {k: statistics.median(v) for k, v in path.items()},
                               "p99_ms": {k: sorted(v)[int(len(v) * 0.99) - 1] for k, v in path.items()},
                               "before_over_now_p50": path_before / path_now}}
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Discovery in a cluster: the pods are the fleet membership the operator writes to Redis.

The membership (`llamafleet_core.membership`) only says which pods exist; whether a pod is up, what it
serves and which slots are busy still comes from polling it, so this module reuses `StaticDiscovery`
for that and only reconciles the SET of watched pods, every `poll_interval`:

- a ready member not yet watched is added (`url|agent_url` from its IP and ports);
- a watched pod that is no longer a ready member is dropped (and its index entries fenced): it leaves
  `endpoints()` at once. Not-ready members are not routed to, as a Kubernetes Service would not;
- a pod still there is left untouched, so its epoch and restart fencing work exactly as in static
  discovery;
- with a membership key, an entry the operator did not sign for its fleet is ignored (signatures.py);
- the namespace of each watched pod's agent goes to the snapshot flow's `AgentTokens`
  (`bind_agent_tokens`): agents accept only their own namespace's token.

A Redis error keeps the last known pods (logged, never raised): the operator writes membership without
expiry precisely so that routers keep serving through a Redis or operator outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import httpx
from prometheus_client import Gauge
from redis.exceptions import RedisError

from llamafleet_core.agent_tokens import AgentTokens
from llamafleet_core.index.redis_conn import RedisLike
from llamafleet_core.membership import DEFAULT_PREFIX, Member, fleet_id, list_fleets, read_entries
from llamafleet_router.background import cancel_and_wait
from llamafleet_router.discovery.addresses import MemberGate
from llamafleet_router.discovery.base import FenceHook, PodStatus
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.signatures import SignatureGate
from llamafleet_router.discovery.static import StaticDiscovery
from llamafleet_router.proxy.gone import GoneSignal

log = logging.getLogger(__name__)


def parse_fleet(text: str) -> tuple[str, str]:
    """`namespace/name` -> (namespace, name)."""
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"fleet must be `namespace/name`: {text!r}")
    return namespace, name


def wanted_specs(members: Sequence[Member], fleet_of: Mapping[str, str] | None = None) -> dict[str, PodSpec]:
    """The pods to watch, by URL: ready members only (pure, so the policy is testable alone), each with
    its fleet's `namespace/name` from `fleet_of` (by URL): who serves a model name (`ownership.py`)."""
    fleets = fleet_of or {}
    return {m.url: PodSpec(m.url, m.agent_url, m.attach, fleets.get(m.url), m.cache_prefix)
            for m in members if m.ready}


class MembershipDiscovery:
    def __init__(
        self,
        redis_client: RedisLike,
        fleets: Sequence[str],
        http: httpx.AsyncClient,
        *,
        poll_interval: float = 1.0,
        model_name: str | None = None,
        fence: FenceHook | None = None,
        startup_timeout: float = 10.0,
        prefix: str = DEFAULT_PREFIX,
        hang_timeout: float | None = None,
        member_networks: Sequence[str] | None = None,
        api_key: str | None = None,
        membership_key: bytes = b"",
    ) -> None:
        self._redis = redis_client
        #: Empty: every fleet listed in Redis (`P:fleets`), re-read on each refresh.
        self._fleets = [parse_fleet(f) for f in fleets]
        self._prefix = prefix
        self._interval = poll_interval
        self._pods = StaticDiscovery([], http, poll_interval=poll_interval, model_name=model_name,
                                     fence=fence, startup_timeout=startup_timeout,
                                     hang_timeout=hang_timeout, api_key=api_key)
        # Members outside `member_networks` (None: the private ranges) are ignored (addresses.py).
        self._gate = MemberGate(member_networks)
        # With a membership key, entries the operator did not sign for their fleet are ignored.
        self._signatures = SignatureGate(membership_key, prefix)
        self._loop: asyncio.Task[None] | None = None
        self._tokens: AgentTokens | None = None

    def show_ignored_on(self, gauge: Gauge) -> None:
        """Show the members ignored for their address or signature on the app's gauge."""
        self._gate.show_on(gauge)
        self._signatures.show_on(gauge)

    def bind_agent_tokens(self, tokens: AgentTokens) -> None:
        """Keep `tokens` told which namespace each watched pod's agent is in (agent_tokens.py)."""
        self._tokens = tokens

    async def start(self) -> None:
        # Pods known before the static watchers start, so start() waits for their first poll.
        await self.refresh()
        await self._pods.start()
        self._loop = asyncio.create_task(self._reconcile_loop(), name="membership discovery")

    async def stop(self) -> None:
        if self._loop is not None:
            await cancel_and_wait(self._loop)
            self._loop = None
        await self._pods.stop()

    async def endpoints(self) -> list[PodStatus]:
        return await self._pods.endpoints()

    def mark_down(self, uid: str) -> None:
        self._pods.mark_down(uid)

    def gone(self, uid: str) -> GoneSignal:
        return self._pods.gone(uid)

    async def poll_once(self) -> None:
        """One membership refresh, then one poll of every pod (tests drive discovery with it)."""
        await self.refresh()
        await self._pods.poll_once()

    async def refresh(self) -> bool:
        """Reconcile the watched pods with Redis; False (pods unchanged) when Redis could not be read."""
        try:
            fleets = self._fleets or await list_fleets(self._redis, prefix=self._prefix)
            stored = [(ns, name, await read_entries(self._redis, ns, name, prefix=self._prefix))
                      for ns, name in fleets]
        except (RedisError, OSError) as exc:
            log.warning("fleet membership unreadable; keeping the last known pods",
                        extra={"error": str(exc)})
            return False
        read = self._signatures.members(stored)
        placed = [(ns, m) for ns, _, members in read for m in members]
        placed = self._gate.admit(placed)  # never a pod or an agent outside member_networks
        fleet_of = {m.url: fleet_id(ns, name) for ns, name, members in read for m in members}
        wanted = wanted_specs([m for _, m in placed], fleet_of)
        if self._tokens is not None:
            # Before any pod is added: its first agent call already carries its namespace's token.
            self._tokens.place({m.agent_url: ns for ns, m in placed if m.url in wanted})
        for url in sorted(self._pods.urls - wanted.keys()):
            log.info("pod left the fleet", extra={"pod": url})
            await self._pods.remove(url)
        for url in sorted(wanted.keys() & self._pods.urls):
            self._pods.update(wanted[url])  # e.g. `attach` as the operator learned it; the pod stays watched
        for url in sorted(wanted.keys() - self._pods.urls):
            log.info("pod joined the fleet", extra={"pod": url})
            self._pods.add(wanted[url])
        return True

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception:
                # A bug in one refresh must not stop discovery for good: the next one may succeed.
                log.exception("membership refresh failed")

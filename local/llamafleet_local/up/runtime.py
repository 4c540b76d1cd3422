"""`LocalFleet`: the whole fleet of a FLEET.yaml as local processes, for `up`, the demo and benchmarks.

    async with LocalFleet(load_fleet(path), UpOptions(port=0)) as fleet:
        await fleet.wait_ready()
        ... requests to fleet.gateway_url ...

Start order: the index, then the gateway (so `/health` answers 503 while the fleet comes up, instead of
refusing connections), then the pods, then warming. The gateway stops first, so no request is sent to
a pod being stopped, then the pods, then the index; each step is bounded (`shutdown.py`). Everything
started is recorded in `state.json` of the run folder (`run_folder.py`), which is what a test checks
for strays. The pods' snapshot folders live in the state folder (`state.py`): the run folder unless
`UpOptions` (`options.py`) asks for one that outlives the run, as the `up` command does.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from llamafleet_core import http_pool
from llamafleet_core.agent_client import AgentClient
from llamafleet_core.index.resp import redacted_url
from llamafleet_core.warming import PrefixSource, WarmPod
from llamafleet_local.redis_server import RedisServer, free_ports
from llamafleet_local.up import gateway as gw
from llamafleet_local.up import shutdown
from llamafleet_local.up.config import FleetConfig
from llamafleet_local.up.contexts import context_note, read_slot_context, trained_context
from llamafleet_local.up.options import EMBEDDED, UpOptions
from llamafleet_local.up.pods import LocalPod, layout
from llamafleet_local.up.pods import attach as pod_attach
from llamafleet_local.up.pods import cache_prefix as pod_cache_prefix
from llamafleet_local.up.procs import dying_with_parent
from llamafleet_local.up.progress import FleetProgress, PrefixProgress, Reporter
from llamafleet_local.up.resolve import Resolved, resolve
from llamafleet_local.up.restores import read_restores, restores_note
from llamafleet_local.up.run_folder import default_run_dir, write_secret, write_state
from llamafleet_local.up.shutdown import Step, run_steps
from llamafleet_local.up.state import StateLock, manifest_key_file, open_state, prefix_key
from llamafleet_local.up.supervise import missing_prefixes, require_all, supervise, warm_prefix
from llamafleet_router.discovery.base import Discovery


class LocalFleet:
    def __init__(self, config: FleetConfig, options: UpOptions | None = None,
                 reporter: Reporter | None = None) -> None:
        self.config = config
        self.options = options or UpOptions()
        self.reporter = reporter or Reporter()
        self.run_dir = (self.options.run_dir or default_run_dir(Path.cwd())).resolve()
        self.progress = FleetProgress(pods_total=config.fleet.spec.replicas, prefixes={
            p.metadata.name: PrefixProgress(p.metadata.name) for p in config.prefixes})
        self.pods: list[LocalPod] = []
        self.results: dict[str, Any] = {}  # prefix name -> WarmResult
        self.sources: dict[str, PrefixSource] = {}
        self.gateway_url = ""
        self.agent_token = secrets.token_urlsafe(32)
        # A fleet with `apiKeySecretRef` runs its llama-servers with a key: here `up` makes one, and
        # gives it to everything that calls them (agents, gateway, warming), as the operator does.
        self.pod_api_key = (secrets.token_urlsafe(32) if config.fleet.spec.api_key_secret_ref is not None
                            else None)
        self.redis: RedisServer | None = None
        self.index: gw.Index | None = None
        self.http = http_pool.async_client(timeout=httpx.Timeout(30.0, read=None))
        self.app: Any = None
        self._stack = contextlib.AsyncExitStack()
        self._ready = asyncio.Event()
        self._log_handler: Any = None
        self.resolved: Resolved | None = None
        self.state_dir: Path | None = None  # known once the model is (its digest names the folder)
        self.prefix_key = ""  # read from the state folder (state.prefix_key)
        self.manifest_key_file: Path | None = None  # made in the state folder (state.manifest_key_file)
        self._state_lock: StateLock | None = None
        self.trained_context: int | None = None  # the model's, from its GGUF (known once resolved)

    # --- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> LocalFleet:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def model(self) -> str:
        return self.config.fleet.spec.model.name

    @property
    def token_file(self) -> Path:
        return self.run_dir / "agent-token"

    @property
    def pod_api_key_file(self) -> Path | None:
        return self.run_dir / "pod-api-key" if self.pod_api_key is not None else None

    async def start(self) -> None:
        """Start everything and warm every prefix; on any failure, stop what was started and raise."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # The token goes to the agents by file (0600), never on a command line or the terminal.
        secret_files = [(self.token_file, self.agent_token)]
        if self.pod_api_key_file is not None and self.pod_api_key is not None:
            secret_files.append((self.pod_api_key_file, self.pod_api_key))
        for path, secret in secret_files:
            write_secret(path, secret)
        self.reporter.say(f"run folder {self.run_dir}")
        self.resolved = await asyncio.to_thread(resolve, self.config, self.reporter.say)
        res = self.resolved
        opts = self.options
        self.trained_context = await asyncio.to_thread(trained_context, res.model)
        self._state_lock = await open_state(self.config.name, res.model, self.run_dir,
                                            state_dir=opts.state_dir, keep=opts.keep_snapshots,
                                            digest=res.spec.model.sha256)
        self.state_dir = self._state_lock.state_dir
        self.prefix_key = prefix_key(self.state_dir)  # the gateway's and warming's block-hash key
        self.manifest_key_file = manifest_key_file(self.state_dir)  # the agents' manifest signatures
        if self.state_dir != self.run_dir:
            self.reporter.say(f"state folder {self.state_dir} (the pods' snapshots, kept from run to run)")
        # Gateway bound and Redis up first, pods' ports all at once next: chosen beside them one by one,
        # an agent was once given the port the gateway bound a moment later (a taken --port still fails
        # before any pod starts, and the gateway is told its pods before it serves).
        sock = gw.bind("127.0.0.1", self.options.port)
        self._stack.callback(sock.close)  # serve closes it too; this covers a failure before it serves
        await self._start_index()
        replicas = self.config.fleet.spec.replicas
        ports = free_ports(2 * replicas)
        layouts = [layout(self.config.name, i, self.run_dir, self.state_dir, (ports[2 * i], ports[2 * i + 1]))
                   for i in range(replicas)]
        self.pods = [
            LocalPod.build(lay, binary=res.binary, spec=res.spec, model=res.model, fleet=self.config.name,
                           token_file=self.token_file, features=res.features,
                           api_key_file=self.pod_api_key_file, signing_key_file=self.manifest_key_file)
            for lay in layouts
        ]
        await self._start_gateway(sock)
        write_state(self)
        await asyncio.gather(*(self._start_pod(pod) for pod in self.pods))
        write_state(self)
        for prefix in self.config.prefixes:
            await warm_prefix(self, prefix.metadata.name, PrefixSource.from_spec(
                prefix.metadata.name, prefix.spec, self.model), pin=prefix.spec.pin)
        await require_all(self)
        self._check_ready()

    async def _start_index(self) -> None:
        choice = self.options.index
        if choice == EMBEDDED:
            # Spawned here, on the event loop's thread, so its death signal follows `up` (`procs.py`).
            self.redis = RedisServer(workdir=self.run_dir, preexec=dying_with_parent())
            self.redis.spawn()
            await asyncio.to_thread(self.redis.wait_ready)
            url: str | None = self.redis.url
        elif choice == "memory":
            url = None
        else:
            url = choice
        self.index = gw.open_index(url)
        self.reporter.say(f"index: {redacted_url(url) if url else 'in memory'}")  # never a password

    async def _start_gateway(self, sock: socket.socket) -> None:
        assert self.index is not None
        self._log_handler = gw.log_to_file(self.run_dir / "gateway.log")
        pods = [(p.layout.llama_url, p.layout.agent_url) for p in self.pods]
        resolved = self.resolved
        attach = resolved is not None and pod_attach(resolved.spec, resolved.features)
        cache_prefix = resolved is not None and pod_cache_prefix(resolved.spec, resolved.features)
        min_batch = self.resolved.min_batch_tokens if self.resolved is not None else None
        self.app = gw.build_app(pods, self.index, self.readiness, model_name=self.model,
                                agent_token=self.agent_token, attach=attach, cache_prefix=cache_prefix,
                                min_batch_tokens=min_batch,
                                pod_api_key=self.pod_api_key, prefix_key=self.prefix_key)
        self.gateway_url = await self._stack.enter_async_context(gw.serve(self.app, sock))
        self.reporter.say(f"gateway {self.gateway_url} (503 on /health until every pod is up and warm)")

    async def _start_pod(self, pod: LocalPod) -> None:
        await pod.start(self.http, self.agent_token, self.options.pod_timeout)
        await self.read_context(pod)
        await self.read_restores(pod)
        pod.ready = True
        self.progress.pods_up.add(pod.name)
        self.report()

    async def stop(self) -> None:
        """Stop everything this fleet started, gateway first; idempotent. Each step is bounded and runs
        even when the one before failed or ran out of time (`shutdown.py`)."""
        self._ready.clear()
        index, redis, self.index, self.redis = self.index, self.redis, None, None
        await run_steps([
            Step("the gateway", self._stack.aclose, shutdown.GATEWAY_S),
            Step("the pods", lambda: shutdown.stop_pods(self.pods), shutdown.PODS_S),
            Step("the index client", lambda: gw.close_index(index), shutdown.SMALL_S),
            Step("redis-server", lambda: shutdown.stop_redis(redis), shutdown.SMALL_S),
            Step("the HTTP client", self.http.aclose, shutdown.SMALL_S),
        ], self.reporter.say)
        shutdown.kill_left(self.pods)
        self.progress.pods_up.clear()
        if self._state_lock is not None:  # only now: until the pods are gone they write in the folder
            self._state_lock.release()
            self._state_lock = None
        if self._log_handler is not None:
            gw.detach_log(self._log_handler)
            self._log_handler = None

    async def run_until(self, stop: asyncio.Event) -> None:
        """Keep the fleet whole until `stop` is set: restart and re-warm pods whose process died
        (`supervise`); raises `FleetFailed` when a pod cannot be kept up. A restart or a warming under
        way when `stop` is set is cancelled, not waited for (it may take the whole pod timeout)."""
        keeping = asyncio.create_task(supervise(self, stop), name="supervise")
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            await asyncio.wait({keeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not keeping.done():
                keeping.cancel()
                await asyncio.wait({keeping}, timeout=shutdown.CANCELLED_S)
        if keeping.done() and not keeping.cancelled():
            keeping.result()  # FleetFailed

    # --- readiness -------------------------------------------------------------------------------

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """The gateway's extra `/health` condition: every pod up and every SharedPrefix warm everywhere."""
        summary = self.progress.summary()
        summary["run_dir"] = str(self.run_dir)
        summary["state_dir"] = str(self.state_dir) if self.state_dir else None
        return self.progress.ready, summary

    @property
    def ready(self) -> bool:
        return self.progress.ready

    async def wait_ready(self, timeout: float = 600.0) -> None:
        """Until every pod is up and warm AND the gateway routes to every pod (its discovery polls, so
        it sees a pod a moment after the pod's agent became ready)."""
        async with asyncio.timeout(timeout):
            await self._ready.wait()
        discovery = self._discovery()
        if discovery is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            statuses = await discovery.endpoints()
            if statuses and all(status.ready for status in statuses):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the gateway did not route to every pod in time")

    def route_around(self, pod: LocalPod) -> None:
        """Tell the gateway's discovery that `pod` is down now. A kill, the restart and the model's
        load can fit between two of its polls (the event loop they share is busy starting the pod),
        and discovery asks a pod's agent whether it is ready only when it saw the pod down: it kept
        routing to the restarted pod, cold, while its warming had failed."""
        discovery = self._discovery()
        if discovery is not None:
            discovery.mark_down(pod.layout.llama_url)  # the uid static discovery gives a pod

    def _discovery(self) -> Discovery | None:
        """The gateway's discovery, once the gateway runs."""
        gateway = self.app.state.gateway if self.app is not None else None
        return gateway.discovery if gateway is not None else None

    def _check_ready(self) -> None:
        if self.progress.ready:
            self._ready.set()
        else:
            self._ready.clear()

    def report(self) -> None:
        self._check_ready()
        self.reporter(self.progress)

    async def read_context(self, pod: LocalPod) -> None:
        """Read back the context `pod`'s slots really hold and say it (`contexts.py`: llama-server caps
        it without a word at the model's training context)."""
        got = await read_slot_context(pod.layout.llama_url, self.http, self.pod_api_key)
        self.progress.slot_contexts[pod.name] = got
        self.reporter.say(context_note(pod.name, self.config.fleet.spec.context_per_slot, got,
                                       self.trained_context))

    async def read_restores(self, pod: LocalPod) -> None:
        """Whether `pod`'s server resumes restored slots (`restores.py`), recorded and said when not."""
        agent = AgentClient(pod.layout.agent_url, self.http, self.agent_token)
        report = await read_restores(agent, self.options.pod_timeout)
        self.progress.restores[pod.name] = str(report.get("state"))
        if note := restores_note(pod.name, report):
            self.reporter.say(note)

    # --- warming ---------------------------------------------------------------------------------

    def warm_pods(self) -> list[WarmPod]:
        # uid = the llama-server URL: the identity the gateway's static discovery gives each pod.
        return [WarmPod(p.name, p.layout.llama_url, p.layout.llama_url, p.layout.agent_url, self.pod_api_key)
                for p in self.pods]

    def missing_on(self, pod: LocalPod) -> list[str]:
        """SharedPrefixes `pod` must still get before it is routed to (`supervise.missing_prefixes`)."""
        return missing_prefixes(self.results, pod.name)

    def required_names(self, pod: LocalPod) -> list[str]:
        """The SharedPrefix snapshots `pod` holds when warm."""
        return sorted(r.snapshot for r in self.results.values()
                      if any(s.pod == pod.name and s.state == "warm" for s in r.pods))

    async def require(self, pod: LocalPod) -> None:
        """Tell the pod's agent which snapshots its `/ready` needs. Always declared, even when empty:
        agents run with `--await-required` and stay unready until told."""
        names = self.required_names(pod)
        await AgentClient(pod.layout.agent_url, self.http, self.agent_token).set_required(names)

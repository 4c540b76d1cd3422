"""One local replica: llama-server plus its snapshot agent, with the exact pod command lines.

Both argv lists come from `llamafleet_core.podspec`, the renderer the operator puts into pod
containers, so a local run exercises the real pod arguments; only the host (loopback), the ports and
the folders differ, and those are parameters of the renderer. The agent's pod name goes through the
environment (`LLAMAFLEET_AGENT_POD_NAME`), as the Kubernetes downward API would pass it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llamafleet_agent.required import REQUIRED_FILE
from llamafleet_core import podspec
from llamafleet_core.agent_client import AgentClient
from llamafleet_core.crd.fleet import LlamaFleetSpec
from llamafleet_core.features import ServerFeatures
from llamafleet_core.networks import LOOPBACK_NETWORKS
from llamafleet_local.redis_server import free_ports
from llamafleet_local.up.procs import Child
from llamafleet_local.up.state import pod_snapshot_dir

HOST = "127.0.0.1"


@dataclass(frozen=True)
class PodLayout:
    """Where one replica lives: its name, loopback ports and folders (fixed for the life of the run,
    so a restarted pod comes back at the same URLs and finds its snapshot folder; the snapshot folder,
    in the state folder, also outlives the run: `state.py`)."""

    name: str
    server_port: int
    agent_port: int
    snapshot_dir: Path
    log_dir: Path

    @property
    def llama_url(self) -> str:
        return f"http://{HOST}:{self.server_port}"

    @property
    def agent_url(self) -> str:
        return f"http://{HOST}:{self.agent_port}"


def layout(fleet: str, index: int, run_dir: Path, state_dir: Path | None = None,
           ports: tuple[int, int] | None = None) -> PodLayout:
    """Pod `index` of `fleet`: its logs in `run_dir`, its snapshots under `state_dir` (default: the run
    folder, which nothing outlives), its server's and agent's `ports` (default: two free ones). The
    name, `<fleet>-<index>`, is the same in every run, so a pod finds the folder it filled in an
    earlier run."""
    name = f"{fleet}-{index}"
    server, agent = ports if ports is not None else free_ports(2)
    return PodLayout(name, server, agent, pod_snapshot_dir(state_dir or run_dir, name), run_dir)


def attach(spec: LlamaFleetSpec, features: ServerFeatures | None) -> bool:
    """`prefixSharing.attach` resolved against what the binary accepts (pure; unknown counts as no)."""
    return podspec.attach_enabled(spec, supported=features is not None and features.slot_attach)


def cache_prefix(spec: LlamaFleetSpec, features: ServerFeatures | None) -> bool:
    """`prefixSharing.cachePrefix` resolved against what the binary accepts (pure; unknown counts as no)."""
    return podspec.cache_prefix_enabled(spec, supported=features is not None and features.cache_prefix)


def snapshot_checkpoints(spec: LlamaFleetSpec, features: ServerFeatures | None) -> bool:
    """`prefixSharing.snapshotCheckpoints` resolved against what the binary accepts (pure)."""
    supported = features is not None and features.slot_checkpoints
    return podspec.snapshot_checkpoints_enabled(spec, supported=supported)


def server_argv(binary: Path, spec: LlamaFleetSpec, pod: PodLayout, model: Path,
                features: ServerFeatures | None = None, api_key_file: Path | None = None) -> list[str]:
    """llama-server's full argv (pure): the binary, then exactly `podspec.llama_server_args`, with the
    patched flags the binary is known to accept (`features`, from its `--help`) as the operator would.
    `api_key_file`: the key a fleet with `apiKeySecretRef` runs its servers with (`up` makes one)."""
    return [str(binary), *podspec.llama_server_args(
        spec, model_path=str(model), port=pod.server_port, slot_save_path=str(pod.snapshot_dir), host=HOST,
        attach=attach(spec, features), cache_prefix=cache_prefix(spec, features),
        snapshot_checkpoints=snapshot_checkpoints(spec, features),
        api_key_file=str(api_key_file) if api_key_file is not None else None,
    )]


def agent_args(spec: LlamaFleetSpec, pod: PodLayout, model: Path, fleet: str, token_file: Path,
               features: ServerFeatures | None = None, api_key_file: Path | None = None,
               signing_key_file: Path | None = None) -> list[str]:
    """The agent's arguments after `llamafleet agent` (pure): exactly `podspec.agent_args`. Its peers
    are on loopback here, so that is where its pulls may go; its manifest key comes from the state
    folder (`state.manifest_key_file`), so that snapshots signed in one run verify in the next."""
    return podspec.agent_args(
        spec, port=pod.agent_port, server_url=pod.llama_url, snapshot_dir=str(pod.snapshot_dir),
        model_path=str(model), host=HOST, fleet=fleet, token_file=str(token_file),
        attach=attach(spec, features), peer_networks=LOOPBACK_NETWORKS,
        llama_api_key_file=str(api_key_file) if api_key_file is not None else None,
        signing_key_file=str(signing_key_file) if signing_key_file is not None else None,
    )


# The agent's own entry point (what `llamafleet agent` runs): the runtime needs no `llamafleet` command.
AGENT_COMMAND = [sys.executable, "-m", "llamafleet_agent.cli"]


@dataclass
class LocalPod:
    """A replica's two processes. `start()` returns once llama-server's `/health` and the agent's
    `/ready` answer 200 (model loaded, model digest known)."""

    layout: PodLayout
    server: Child
    agent: Child
    restarts: int = 0
    ready: bool = False
    children: list[Child] = field(init=False)

    def __post_init__(self) -> None:
        self.children = [self.agent, self.server]  # stop order: the agent first, it calls the server

    @classmethod
    def build(cls, pod: PodLayout, *, binary: Path, spec: LlamaFleetSpec, model: Path, fleet: str,
              token_file: Path, features: ServerFeatures | None = None,
              api_key_file: Path | None = None, signing_key_file: Path | None = None) -> LocalPod:
        argv = server_argv(binary, spec, pod, model, features, api_key_file)
        server = Child(f"{pod.name} llama-server", argv, pod.log_dir / f"{pod.name}.llama-server.log")
        args = agent_args(spec, pod, model, fleet, token_file, features, api_key_file, signing_key_file)
        agent = Child(f"{pod.name} agent", [*AGENT_COMMAND, *args], pod.log_dir / f"{pod.name}.agent.log",
                      env={"LLAMAFLEET_AGENT_POD_NAME": pod.name})
        return cls(pod, server, agent)

    @property
    def name(self) -> str:
        return self.layout.name

    def dead(self) -> Child | None:
        """The first of its processes that has exited, if any (only meaningful once started)."""
        for child in (self.server, self.agent):
            if child.proc is not None and not child.running:
                return child
        return None

    async def start(self, http: httpx.AsyncClient, agent_token: str, timeout: float = 120.0) -> None:
        """Start both processes. Nothing is declared to the agent yet: it runs with --await-required, so
        its `/ready` (which the gateway routes by) stays 503 until the warmer has warmed the pod and
        declared what it must hold (`LocalFleet.require`), also after a restart. Returns once the agent
        knows the model's digest, which fingerprints snapshots: warming must not start before."""
        self.ready = False
        self.layout.snapshot_dir.mkdir(parents=True, exist_ok=True)
        # The agent keeps its declaration in the folder, so that a restarted container is ready again
        # where no warmer is around. Here `up` is the warmer: a declaration left from before a restart,
        # or by an earlier run (the state folder outlives runs, and its SharedPrefixes may have changed
        # since), is withdrawn, and the pod becomes routable only once this run has warmed it (verified
        # its snapshots, registered them in the index) and declared what it must hold now.
        (self.layout.snapshot_dir / REQUIRED_FILE).unlink(missing_ok=True)
        self.server.start()
        await self.server.wait_http(self.layout.llama_url + "/health", http, timeout)
        await self.start_agent(http, agent_token, timeout)

    async def start_agent(
        self, http: httpx.AsyncClient, agent_token: str, timeout: float = 120.0,
        required: Sequence[str] | None = None,
    ) -> None:
        """Start the agent alone (llama-server already runs), declare `required` when given (a
        restarted agent beside a warm server), and wait for the model's digest."""
        self.agent.start()
        await self.agent.wait_http(self.layout.agent_url + "/health", http, timeout)
        if required is not None:
            await AgentClient(self.layout.agent_url, http, agent_token).set_required(list(required))
        deadline = time.monotonic() + timeout
        while not await self._digest_known(http):
            if time.monotonic() > deadline:
                raise self.agent.failure(f"did not know the model's digest within {timeout:.0f}s")
            await asyncio.sleep(0.1)

    async def _digest_known(self, http: httpx.AsyncClient) -> bool:
        try:
            body = (await http.get(self.layout.agent_url + "/ready", timeout=2.0)).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(body.get("model_digest"))

    async def stop(self, grace: float = 10.0, kill_wait: float = 10.0) -> None:
        self.ready = False
        for child in self.children:
            await child.stop(grace, kill_wait)

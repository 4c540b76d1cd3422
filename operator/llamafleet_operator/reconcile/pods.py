"""Pure reads of pod objects: readiness, endpoints and start epoch (why one is stuck: stuck.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from llamafleet_core import labels as L
from llamafleet_core import podspec
from llamafleet_core.membership import Member
from llamafleet_core.warming import WarmPod

Pod = dict[str, Any]


def name(pod: Pod) -> str:
    return str(pod["metadata"]["name"])


def namespace(pod: Pod) -> str:
    return str(pod["metadata"].get("namespace") or "")


def deleting(pod: Pod) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def ready(pod: Pod) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return not deleting(pod) and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def running(pod: Pod) -> bool:
    """Started and reachable: what the warmer needs (a pod turns Ready only after it is warm)."""
    status = pod.get("status") or {}
    return not deleting(pod) and status.get("phase") == "Running" and bool(status.get("podIP"))


def ports(pod: Pod) -> tuple[int, int]:
    """(llama-server, agent) ports from the containers' named ports, defaulting to the rendered ones."""
    server, agent = podspec.SERVER_PORT, podspec.AGENT_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                server = int(port["containerPort"])
            elif port.get("name") == "agent":
                agent = int(port["containerPort"])
    return server, agent


def epoch_ms(pod: Pod) -> int:
    """Start time in ms since 1970 (status.startTime, else creation): fences a replaced pod's entries."""
    stamp = (pod.get("status") or {}).get("startTime") or pod["metadata"].get("creationTimestamp")
    if not stamp:
        return 0
    return int(datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() * 1000)


def warm_pod(pod: Pod, api_key: str | None = None) -> WarmPod:
    """The pod as warming sees it; `api_key`: its llama-server's own key (`Context.pod_api_key`)."""
    server, agent = ports(pod)
    ip = pod["status"]["podIP"]
    return WarmPod(name=name(pod), uid=str(pod["metadata"]["uid"]), llama_url=f"http://{ip}:{server}",
                   agent_url=f"http://{ip}:{agent}", llama_api_key=api_key)


def server_container(pod: Pod) -> dict[str, Any] | None:
    """The pod's llama-server container, as the pod (not its fleet's template) runs it."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") == "llama-server"), None)


def server_flag(pod: Pod, flag: str) -> bool:
    """Whether this pod's llama-server runs with `flag` (--slot-attach, --cache-prefix). Its own args are
    the truth: during the rollout that turns a flag on, old pods run without it while new ones have it."""
    server = server_container(pod)
    return server is not None and flag in (server.get("args") or [])


def server_arg(pod: Pod, flag: str) -> str | None:
    """The value this pod's llama-server is given after `flag` (`-m`: its model file), if any."""
    server = server_container(pod)
    args = list(server.get("args") or []) if server is not None else []
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == flag), None)


def member(pod: Pod, *, model: str, slots: int, warm: tuple[str, ...]) -> Member:
    server, agent = ports(pod)
    annotations = (pod["metadata"].get("annotations") or {})
    return Member(
        name=name(pod), uid=str(pod["metadata"]["uid"]), ip=str(pod["status"]["podIP"]),
        port=server, agent_port=agent, slots=int(annotations.get(L.SLOTS, slots)), model=model,
        ready=ready(pod), epoch=epoch_ms(pod), attach=server_flag(pod, "--slot-attach"),
        cache_prefix=server_flag(pod, "--cache-prefix"), warm=warm,
    )


"""What the rendered fleet pod gives each container to reach the other (security review findings 8, 13):

- with `apiKeySecretRef`, llama-server runs with `--api-key-file`, and the agent (which calls its
  `/props` and `/slots`) mounts the same Secret and is told the file (`--llama-api-key-file`);
- the agent token, from which the agent derives its manifest-signing key, is mounted into the agent
  container only: llama-server's container writes the snapshot folder and must not be able to sign;
- the operator's `agent_peer_networks` become the agents' `--peer-networks`.
"""

from __future__ import annotations

from typing import Any

from tests.operator.test_render import containers, rendered


def mounts(c: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_the_agent_gets_llama_servers_key_and_only_the_agent_gets_its_token() -> None:
    objs = containers(rendered("gpu-pvc", agent_token_secret="fleet-agent-token"))
    server, agent = objs["llama-server"], objs["agent"]
    key_file = flag(server["args"], "--api-key-file")
    assert key_file is not None, "the spec sets apiKeySecretRef"
    assert flag(agent["args"], "--llama-api-key-file") == key_file
    assert key_file.startswith(mounts(agent)["api-key"])
    assert "agent-token" in mounts(agent) and "agent-token" not in mounts(server)
    assert flag(agent["args"], "--peer-networks") is None  # unset: the agent's default


def test_without_a_key_the_agent_is_told_none_and_peer_networks_are_passed() -> None:
    objs = containers(rendered("minimal", agent_peer_networks=("10.244.0.0/16", "fd00::/8")))
    assert flag(objs["llama-server"]["args"], "--api-key-file") is None
    assert flag(objs["agent"]["args"], "--llama-api-key-file") is None
    assert "api-key" not in mounts(objs["agent"])
    assert flag(objs["agent"]["args"], "--peer-networks") == "10.244.0.0/16,fd00::/8"

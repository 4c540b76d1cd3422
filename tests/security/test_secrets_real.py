"""Secrets and the agent's door, on a real `up` fleet plus a real `llamafleet router` process with API
keys: the agent answers 401 without its token and refuses snapshot names that are paths or links; no
log, state file or terminal line of the run ever contains the API key, a wrong key a client sent, or
the agent token."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from llamafleet_core.agent_client import AgentClient
from llamafleet_local.reliability.bed import PREFIX, Bed, kill, running_fleet, until
from llamafleet_local.reliability.replicas import start_replica

pytestmark = [pytest.mark.llama, pytest.mark.redis]

AGENT_ROUTES = [("GET", "/v1/fingerprint"), ("GET", "/v1/snapshots"), ("GET", "/v1/required"),
                ("PUT", "/v1/required"), ("POST", "/v1/snapshots/save"), ("POST", "/v1/snapshots/pull"),
                ("GET", "/v1/snapshots/x"), ("DELETE", "/v1/snapshots/x"), ("GET", "/v1/snapshots/x/file"),
                ("POST", "/v1/snapshots/x/restore"), ("GET", "/metrics")]
BAD_NAMES = ["../x", "../../etc/passwd", "/etc/passwd", "a/b", "..", ".", "x\x00y", "%2e%2e%2fx",
             "x" * 300, "con:x"]


@pytest.fixture
async def bed(llama_server_bin: Path, tmp_path: Path) -> AsyncIterator[Bed]:
    async with running_fleet(llama_server_bin, tmp_path / "run") as fleet:
        yield fleet


async def test_the_agent_answers_401_without_its_token_and_refuses_path_names(bed: Bed) -> None:
    pod = bed.pod(0)
    url = pod.layout.agent_url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": bed.fleet.agent_token},
                    {"Authorization": f"Basic {bed.fleet.agent_token}"}):
        for method, path in AGENT_ROUTES:
            resp = await bed.http.request(method, url + path, headers=headers, json={})
            assert resp.status_code == 401, (method, path, headers.keys(), resp.status_code)
    for probe in ("/health", "/ready"):
        assert (await bed.http.get(url + probe)).status_code == 200

    agent = AgentClient(url, bed.http, bed.fleet.agent_token)
    name = bed.fleet.results[PREFIX].snapshot
    folder = pod.layout.snapshot_dir
    (folder / "link.bin").symlink_to(folder / f"{name}.bin")
    (folder / "link.json").symlink_to(folder / f"{name}.json")
    (folder / "abs.bin").symlink_to("/etc/passwd")
    auth = {"Authorization": f"Bearer {bed.fleet.agent_token}"}
    peer = bed.pod(1).layout.agent_url
    for bad in [*BAD_NAMES, "link", "abs"]:
        links = bad in ("link", "abs")  # valid names whose files are links: reading through them is refused
        # Names percent-encoded, so that the client does not resolve dot segments before the agent sees them.
        quoted = quote(bad, safe="").replace(".", "%2E")
        for method, path, body in (("POST", f"/v1/snapshots/{quoted}/restore", {"slot": 0}),
                                   ("GET", f"/v1/snapshots/{quoted}", None),
                                   ("GET", f"/v1/snapshots/{quoted}/file", None),
                                   ("DELETE", f"/v1/snapshots/{quoted}", None),
                                   ("POST", "/v1/snapshots/pull", {"name": bad, "source": peer}),
                                   ("POST", "/v1/snapshots/save", {"slot": 0, "name": bad})):
            if links and (method == "DELETE" or path.endswith(("pull", "save"))):
                continue
            resp = await bed.http.request(method, url + path, json=body, headers=auth)
            assert 400 <= resp.status_code < 500, (bad, method, path, resp.status_code)
            assert b"root:" not in resp.content
    for link in ("link", "abs"):  # deleting a link removes the link, never what it points to
        assert (await bed.http.delete(f"{url}/v1/snapshots/{link}", headers=auth)).status_code < 500
    assert (await agent.restore(name, 0)).n_tokens > 0  # the real one still restores
    assert (folder / f"{name}.bin").is_file() and not (folder / "x.bin").exists()


async def test_no_secret_is_ever_written_to_a_log(bed: Bed) -> None:
    """Requests with the right key, a wrong key and no key through a real router process with keys on,
    snapshot traffic with the agent token: then every file of the run folder and the terminal output."""
    key, wrong = f"sk-{secrets.token_urlsafe(24)}", f"sk-wrong-{secrets.token_urlsafe(24)}"
    run_dir = bed.fleet.run_dir
    env = {"LLAMAFLEET_ROUTER_API_KEYS": f"team:{key}", "LLAMAFLEET_ROUTER_LOG_LEVEL": "DEBUG"}
    proc, url = start_replica(bed, run_dir / "gateway-keys.log", env=env)
    try:
        async def healthy() -> bool:
            try:
                return (await bed.http.get(url + "/health", timeout=2.0)).status_code == 200
            except httpx.HTTPError:
                return False

        assert await until(healthy, 30.0, every=0.1) is not None
        for i, headers in enumerate([{"Authorization": f"Bearer {key}"}, {"x-api-key": key},
                                     {"Authorization": f"Bearer {wrong}"}, {"x-api-key": wrong}, {}]):
            resp = await bed.http.post(url + "/v1/chat/completions", json=bed.body(i, stream=i % 2 == 0),
                                       headers=headers)
            assert resp.status_code == (200 if i < 2 else 401), resp.text
        resp = await bed.http.post(bed.url + "/v1/chat/completions", json=bed.body(5, stream=False))
        assert resp.status_code == 200
    finally:
        kill(proc.pid)
        proc.wait(10)
    for secret in (key, wrong, bed.fleet.agent_token):
        leaks = [p.name for p in sorted(run_dir.rglob("*"))
                 if p.is_file() and p.name != "agent-token" and p.suffix != ".bin"
                 and secret.encode() in p.read_bytes()]
        assert not leaks, f"a secret is written in {leaks}"
        assert secret not in bed.log.getvalue()
    assert (run_dir / "gateway-keys.log").stat().st_size > 0 and (run_dir / "gateway.log").stat().st_size > 0

"""Secrets and the agent's door, on a real `up` fleet plus a real `llamafleet router` process with API
keys: the agent answers 401 without its token and refuses snapshot names that are paths or links (for
being links, not for anything else); no log, state file or terminal line of the run ever contains the
API key, a wrong key a client sent, the agent token or a wrong one, whole or in part."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from llamafleet_core.agent_client import AgentClient
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from llamafleet_testbed.reliability.bed import PREFIX, Bed, kill, running_fleet, until
from llamafleet_testbed.reliability.replicas import start_replica

pytestmark = [pytest.mark.llama, pytest.mark.redis]

AGENT_ROUTES = [("GET", "/v1/fingerprint"), ("GET", "/v1/snapshots"), ("GET", "/v1/required"),
                ("PUT", "/v1/required"), ("POST", "/v1/snapshots/save"), ("POST", "/v1/snapshots/pull"),
                ("GET", "/v1/snapshots/x"), ("DELETE", "/v1/snapshots/x"), ("GET", "/v1/snapshots/x/file"),
                ("POST", "/v1/snapshots/x/restore")]  # /metrics is open: test_agent_trust_real.py
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

    auth = {"Authorization": f"Bearer {bed.fleet.agent_token}"}
    peer = bed.pod(1).layout.agent_url
    for bad in BAD_NAMES:
        # Names percent-encoded, so that the client does not resolve dot segments before the agent sees them.
        quoted = quote(bad, safe="").replace(".", "%2E")
        for method, path, body in (("POST", f"/v1/snapshots/{quoted}/restore", {"slot": 0}),
                                   ("GET", f"/v1/snapshots/{quoted}", None),
                                   ("GET", f"/v1/snapshots/{quoted}/file", None),
                                   ("DELETE", f"/v1/snapshots/{quoted}", None),
                                   ("POST", "/v1/snapshots/pull", {"name": bad, "source": peer}),
                                   ("POST", "/v1/snapshots/save", {"slot": 0, "name": bad})):
            resp = await bed.http.request(method, url + path, json=body, headers=auth)
            assert 400 <= resp.status_code < 500, (bad, method, path, resp.status_code)
            assert b"root:" not in resp.content


SECRET = b"root:x:0:0:a secret line\n"  # what a link planted in the folder could expose


def plant(folder: Path, name: str, outside: Path, key: bytes) -> None:
    """Next to snapshot `name`: `copy` (regular files), `link` (its manifest a link to one outside the
    folder), `abs` (its file an absolute link to the real file) and `passwd` (its file a link to a secret
    file outside). Every manifest names its snapshot and gives the size and hash of the file it points
    at, and is signed with the agents' manifest `key`: each is refused for its link, not its signature."""
    real = folder / f"{name}.bin"
    outside.mkdir()
    (outside / "passwd").write_bytes(SECRET)
    manifest = json.loads((folder / f"{name}.json").read_bytes())

    def write_manifest(path: Path, as_name: str, target: Path = real) -> None:
        data = target.read_bytes()
        edited = SnapshotManifest.model_validate({**manifest, "name": as_name, "size": len(data),
                                                  "sha256": hashlib.sha256(data).hexdigest()})
        path.write_text(sign_manifest(edited, key).model_dump_json())

    shutil.copyfile(real, folder / "copy.bin")
    write_manifest(folder / "copy.json", "copy")
    write_manifest(outside / "link.json", "link")
    (folder / "link.json").symlink_to(outside / "link.json")
    shutil.copyfile(real, folder / "link.bin")
    write_manifest(folder / "abs.json", "abs")
    (folder / "abs.bin").symlink_to(real.resolve())
    write_manifest(folder / "passwd.json", "passwd", outside / "passwd")
    (folder / "passwd.bin").symlink_to(outside / "passwd")


def targets(folder: Path, name: str, outside: Path) -> tuple[list[str], bytes]:
    return sorted(p.name for p in outside.iterdir()), (folder / f"{name}.bin").read_bytes()


async def test_the_agent_refuses_to_read_through_links_and_for_that_reason_only(
    bed: Bed, tmp_path: Path,
) -> None:
    """Snapshots that would be served and restored but for a link (`plant`): every file a link points
    to exists and matches its manifest, and the regular copy built the same way IS served and restored.
    So each refusal is the link rule's (kind `symlink`), not a missing or mismatched manifest."""
    pod = bed.pod(0)
    url, folder = pod.layout.agent_url, pod.layout.snapshot_dir
    auth = {"Authorization": f"Bearer {bed.fleet.agent_token}"}
    name = bed.fleet.results[PREFIX].snapshot
    real = (folder / f"{name}.bin").read_bytes()
    outside = tmp_path / "outside"
    assert bed.fleet.manifest_key_file is not None
    plant(folder, name, outside, manifest_key(bed.fleet.manifest_key_file.read_text().strip()))

    assert (await bed.http.get(f"{url}/v1/snapshots/copy/file", headers=auth)).content == real
    restored = await bed.http.post(f"{url}/v1/snapshots/copy/restore", json={"slot": 0}, headers=auth)
    assert restored.status_code == 200 and restored.json()["n_tokens"] > 0, restored.text
    for link in ("link", "abs", "passwd"):
        for method, path, body in (("GET", f"/v1/snapshots/{link}/file", None),
                                   ("POST", f"/v1/snapshots/{link}/restore", {"slot": 0})):
            resp = await bed.http.request(method, url + path, json=body, headers=auth)
            assert resp.status_code == 409, (link, path, resp.status_code, resp.text)
            assert resp.json()["error"]["kind"] == "symlink", (link, path, resp.text)
            assert b"root:" not in resp.content
    link_manifest = await bed.http.get(f"{url}/v1/snapshots/link", headers=auth)
    assert link_manifest.json()["error"]["kind"] == "symlink", link_manifest.text

    for gone in ("link", "abs", "passwd", "copy"):  # deleting a link removes the link, never its target
        assert (await bed.http.delete(f"{url}/v1/snapshots/{gone}", headers=auth)).status_code == 200
    assert targets(folder, name, outside) == (["link.json", "passwd"], real)
    agent = AgentClient(url, bed.http, bed.fleet.agent_token)
    assert (await agent.restore(name, 0)).n_tokens > 0  # the real one still restores


def leaked(secret: str, data: bytes) -> bool:
    """The secret, or any 12-character piece of it (a log that truncates or slices a key), in `data`."""
    return any(secret[i:i + 12].encode() in data for i in range(len(secret) - 11))


async def test_no_secret_is_ever_written_to_a_log(bed: Bed) -> None:
    """Requests with the right key, a wrong key and no key through a real router process with keys on,
    requests to every agent with its token and with a wrong one, snapshot traffic: then every file of the
    run folder and the terminal output. The router's and the agents' logs are among them, and recorded
    the refused requests: the grep reads logs that saw the wrong secrets arrive."""
    key, wrong = f"sk-{secrets.token_urlsafe(24)}", f"sk-wrong-{secrets.token_urlsafe(24)}"
    wrong_token = f"agent-wrong-{secrets.token_urlsafe(24)}"
    run_dir = bed.fleet.run_dir
    router_log = run_dir / "gateway-keys.log"
    env = {"LLAMAFLEET_ROUTER_API_KEYS": f"team:{key}", "LLAMAFLEET_ROUTER_LOG_LEVEL": "DEBUG"}
    proc, url = start_replica(bed, router_log, env=env)
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
        for pod in bed.fleet.pods:
            for token, status in ((wrong_token, 401), (bed.fleet.agent_token, 200)):
                for method, path in (("GET", "/v1/snapshots"), ("GET", "/v1/fingerprint")):
                    resp = await bed.http.request(method, pod.layout.agent_url + path,
                                                  headers={"Authorization": f"Bearer {token}"})
                    assert resp.status_code == status, (pod.name, path, resp.text)
    finally:
        kill(proc.pid)
        proc.wait(10)
    agent_logs = [pod.layout.log_dir / f"{pod.name}.agent.log" for pod in bed.fleet.pods]
    for log in [router_log, run_dir / "gateway.log", *agent_logs]:
        assert log.is_relative_to(run_dir) and log.stat().st_size > 0, log
    for log in agent_logs:
        assert b'"GET /v1/snapshots HTTP/1.1" 401' in log.read_bytes(), f"{log.name} did not log the 401"
    assert b'"code":"invalid_api_key"' in router_log.read_bytes(), "the router did not log the refusals"
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != "agent-token"
             and p.suffix != ".bin"]
    for secret in (key, wrong, bed.fleet.agent_token, wrong_token):
        leaks = [p.name for p in files if leaked(secret, p.read_bytes())]
        assert not leaks, f"a secret is written in {leaks}"
        assert not leaked(secret, bed.log.getvalue().encode())

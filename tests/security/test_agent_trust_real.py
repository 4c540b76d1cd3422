"""Findings 7, 8, 9 and 18 of the security review, on a real `up` fleet (real llama-servers and agents):

- 7: a pull goes only to `http(s)://<IP literal in peer_networks>:<port>`: no host name, no path, no
  metadata address ever receives a request (nor the token); a peer's status and body are never echoed.
- 8: a snapshot is bound to the text it claims by a manifest signed with a key only agents hold: a
  peer's manifest that is not signed, or one planted in the folder (llama-server's container writes it
  too), is refused, deleted and counted, never listed for the gateway's index, never restored. A file
  that no longer matches its manifest is deleted as well.
- 9: a peer's `size` evicts nothing: the budget is charged with the bytes that arrive.
- 18: the agent's `/metrics` answers without the token (Prometheus holds none), with no names in it.

The lying peers are `peer_stub` servers on loopback (the fleet's peer network here), answering what a
peer that holds the agents' key, or one that does not, would send.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llamafleet_core import podspec
from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from llamafleet_testbed.reliability.bed import PREFIX, Bed, running_fleet
from tests.security.peer_stub import Stub, stub_server

pytestmark = [pytest.mark.llama, pytest.mark.redis]


@pytest.fixture
async def bed(llama_server_bin: Path, tmp_path: Path) -> AsyncIterator[Bed]:
    async with running_fleet(llama_server_bin, tmp_path / "run") as fleet:
        yield fleet


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    async with stub_server() as s:
        yield s


def agents_key(bed: Bed) -> bytes:
    """The manifest key the fleet's agents sign with (from the secret `up` keeps in its state folder)."""
    assert bed.fleet.manifest_key_file is not None
    return manifest_key(bed.fleet.manifest_key_file.read_text().strip())


def agent(bed: Bed, i: int) -> AgentClient:
    return AgentClient(bed.pod(i).layout.agent_url, bed.http, bed.fleet.agent_token)


async def agent_metric(bed: Bed, i: int, name: str, **labels: str) -> float:
    """A sample of pod `i`'s agent `/metrics`, read WITHOUT the token (0 when absent)."""
    resp = await bed.http.get(bed.pod(i).layout.agent_url + "/metrics")
    assert resp.status_code == 200, resp.text
    return sum(s.value for f in text_string_to_metric_families(resp.text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def shared_manifest(bed: Bed, i: int) -> SnapshotManifest:
    """The SharedPrefix snapshot's manifest on pod `i`, as its agent signed it."""
    return await agent(bed, i).get(bed.fleet.results[PREFIX].snapshot)


async def test_a_pull_goes_only_to_a_peer_address_and_never_echoes_the_peer(bed: Bed, stub: Stub) -> None:
    """Sources that are not a bare base URL on an IP literal of the peer networks are refused before any
    request leaves the agent: the stub (listening on the very address some of them name) sees nothing.
    A peer inside the networks that answers 403 with a body gives the caller a kind, not the answer."""
    port = stub.port
    refused = [f"http://localhost:{port}", f"http://127.0.0.1:{port}/collect?", f"http://127.0.0.1:{port}/x",
               f"http://user:pw@127.0.0.1:{port}", f"http://127.0.0.1:{port}#frag",
               f"ftp://127.0.0.1:{port}", "http://169.254.169.254:80", "http://127.0.0.1",
               f"http://0x7f.1:{port}"]
    for source in refused:
        with pytest.raises(AgentError) as err:
            await agent(bed, 0).pull("anything", source)
        assert (err.value.status, err.value.kind) == (400, "source"), (source, err.value.reason)
    assert stub.seen == [], f"a refused source was contacted: {stub.paths()}"

    secret_body = b'{"detail": "peer-body-that-must-not-travel-9f3a"}'
    stub.answers["/v1/snapshots/probe"] = (403, secret_body)
    with pytest.raises(AgentError) as err:
        await agent(bed, 0).pull("probe", stub.url)
    assert (err.value.status, err.value.kind) == (502, "peer"), err.value.reason
    assert "403" not in err.value.reason and "peer-body" not in err.value.reason, err.value.reason
    assert stub.paths() == ["/v1/snapshots/probe"]


async def test_a_peer_manifest_not_signed_by_an_agent_is_refused_counted_and_never_stored(
    bed: Bed, stub: Stub,
) -> None:
    """A peer offers the real SharedPrefix file under a manifest claiming other text (what it needs to
    plant KV for someone else's prompt): every byte and token hash checks out, only the signature does
    not. Refused before the file is fetched; the same manifest signed with the agents' key is taken,
    so it is the signature that decides."""
    real = await shared_manifest(bed, 1)
    data = (bed.pod(1).layout.snapshot_dir / f"{real.name}.bin").read_bytes()
    lie = real.model_copy(update={"name": "planted", "text_hash": "ab" * 16, "n_chars": 9})
    stub.answers["/v1/snapshots/planted"] = (200, lie.model_dump_json().encode())  # old signature
    stub.answers["/v1/snapshots/planted/file"] = (200, data)
    before = await agent_metric(bed, 0, "llamafleet_agent_untrusted_snapshots_total", reason="peer")

    with pytest.raises(AgentError) as err:
        await agent(bed, 0).pull("planted", stub.url)
    assert (err.value.status, err.value.kind) == (502, "signature"), err.value.reason
    assert stub.paths() == ["/v1/snapshots/planted"], "the file was fetched for an unsigned manifest"
    folder = bed.pod(0).layout.snapshot_dir
    assert not (folder / "planted.bin").exists() and not (folder / "planted.json").exists()
    assert "planted" not in [m.name for m in await agent(bed, 0).list()]
    after = await agent_metric(bed, 0, "llamafleet_agent_untrusted_snapshots_total", reason="peer")
    assert after == before + 1

    signed = sign_manifest(lie, agents_key(bed))
    stub.answers["/v1/snapshots/planted"] = (200, signed.model_dump_json().encode())
    assert (await agent(bed, 0).pull("planted", stub.url)).sha256 == hashlib.sha256(data).hexdigest()


async def test_a_snapshot_planted_in_the_folder_is_refused_deleted_and_never_listed(bed: Bed) -> None:
    """What a compromised llama-server container can do (it mounts the folder read-write): copy a real
    slot file under a new name with a manifest claiming other text. Without the agents' key its
    manifest is not signed: the listing the gateway indexes from skips it, and it is gone. A signed
    snapshot whose file was then altered is refused and deleted too. `/metrics`, read without the
    token, counts both and names neither."""
    folder = bed.pod(0).layout.snapshot_dir
    real = await shared_manifest(bed, 0)
    before = await agent_metric(bed, 0, "llamafleet_agent_untrusted_snapshots_total", reason="signature")
    (folder / "planted.bin").write_bytes((folder / f"{real.name}.bin").read_bytes())
    forged = real.model_copy(update={"name": "planted", "text_hash": "cd" * 16})
    guessed = sign_manifest(forged, manifest_key("a guessed key"))
    (folder / "planted.json").write_text(guessed.model_dump_json())

    assert "planted" not in [m.name for m in await agent(bed, 0).list()]
    assert not (folder / "planted.bin").exists() and not (folder / "planted.json").exists()
    with pytest.raises(AgentError) as err:
        await agent(bed, 0).restore("planted", slot=0)
    assert err.value.status == 404, err.value.reason
    assert await agent_metric(bed, 0, "llamafleet_agent_untrusted_snapshots_total",
                              reason="signature") == before + 1

    # A signed snapshot of this pod, its file then altered in place.
    tokens = await LlamaClient(bed.pod(0).layout.llama_url, bed.http).tokenize("A short conversation. " * 20)
    await LlamaClient(bed.pod(0).layout.llama_url, bed.http).prefill(tokens, slot=1)
    await agent(bed, 0).save(1, "altered", tokens=tokens)
    data = bytearray((folder / "altered.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "altered.bin").write_bytes(bytes(data))
    with pytest.raises(AgentError) as err:
        await agent(bed, 0).restore("altered", slot=1)
    assert err.value.kind == "checksum", err.value.reason
    assert not (folder / "altered.bin").exists() and not (folder / "altered.json").exists()
    assert await agent_metric(bed, 0, "llamafleet_agent_untrusted_snapshots_total", reason="checksum") == 1

    text = (await bed.http.get(bed.pod(0).layout.agent_url + "/metrics")).text
    for secret in (real.name, "planted", "altered", bed.fleet.agent_token):
        assert secret not in text, f"{secret[:12]}... in the agent's open /metrics"


async def test_a_peer_lying_about_size_evicts_nothing(bed: Bed, stub: Stub) -> None:
    """Pod 0 holds two unpinned snapshots. A peer claims a file of 10^15 bytes (over the budget: refused
    before any byte), then one of exactly the budget that it never sends (4 KB arrive): both pulls fail
    and both snapshots are still there. Before, the agent evicted for the claimed size first."""
    llama = LlamaClient(bed.pod(0).layout.llama_url, bed.http)
    for slot, name in enumerate(("keep-1", "keep-2")):
        tokens = await llama.tokenize(f"Conversation {name}: the build failed on step three. " * 12)
        await llama.prefill(tokens, slot=slot)
        await agent(bed, 0).save(slot, name, tokens=tokens)
    kept = sorted(m.name for m in await agent(bed, 0).list())
    assert {"keep-1", "keep-2"} <= set(kept)

    key = agents_key(bed)
    base = (await shared_manifest(bed, 1)).model_copy(update={"pinned": False})
    assert bed.fleet.resolved is not None
    budget = podspec.snapshot_budget_bytes(bed.fleet.resolved.spec)
    for name, size in (("huge", 10**15), ("liar", budget)):
        claim = sign_manifest(base.model_copy(update={"name": name, "size": size}), key)
        stub.answers[f"/v1/snapshots/{name}"] = (200, claim.model_dump_json().encode())
        stub.answers[f"/v1/snapshots/{name}/file"] = (200, b"\0" * 4096)
    with pytest.raises(AgentError) as err:
        await agent(bed, 0).pull("huge", stub.url)
    assert (err.value.status, err.value.kind) == (413, "budget"), err.value.reason
    assert "/v1/snapshots/huge/file" not in stub.paths()
    with pytest.raises(AgentError) as err:
        await agent(bed, 0).pull("liar", stub.url)
    assert err.value.kind == "size", err.value.reason
    assert sorted(m.name for m in await agent(bed, 0).list()) == kept
    leftovers = [p.name for p in bed.pod(0).layout.snapshot_dir.iterdir() if p.name.startswith(".pull-")]
    assert leftovers == []


async def test_agent_metrics_open_without_the_token_and_everything_else_closed(bed: Bed) -> None:
    """Prometheus scrapes the agents with no credential (the PodMonitor has none): `/metrics` answers
    200 without the token, in Prometheus' format; every snapshot route still wants the token."""
    url = bed.pod(0).layout.agent_url
    resp = await bed.http.get(url + "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain"), resp.text
    names = {f.name for f in text_string_to_metric_families(resp.text)}
    assert {"llamafleet_agent_snapshots", "llamafleet_agent_operations"} <= names, names
    assert (await bed.http.get(url + "/v1/snapshots")).status_code == 401
    shared = bed.fleet.results[PREFIX].snapshot
    assert (await bed.http.get(url + f"/v1/snapshots/{shared}")).status_code == 401
    listed = json.loads((await bed.http.get(url + "/v1/snapshots", headers={
        "Authorization": f"Bearer {bed.fleet.agent_token}"})).text)
    assert listed["snapshots"], "the pod holds its SharedPrefix snapshot"

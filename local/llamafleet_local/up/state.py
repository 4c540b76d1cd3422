"""The state folder of `llamafleet up`: what a fleet keeps from one run to the next, its pods' snapshots.

Why a folder of its own, outside the run folder: a run folder is new at every start (logs, state.json),
and snapshots kept there were lost with it, so the first session of every run computed its whole
prefix again. The agents already keep their folders under a byte budget (least recently used out
first), so a folder that outlives the run costs bounded disk and makes a stopped-and-started fleet
behave like a restarted pod: the gateway's resync lists every agent at its first epoch and records
what it holds, and the next session restores instead of computing.

One folder per fleet name and model (the first 16 hex digits of the model file's sha256, the digest
the agents put into every snapshot's fingerprint): another model's snapshots could never be restored
anyway, and a fleet switched back to an earlier model finds its snapshots again. Layout:

    <state>/snapshots/<pod>/   each pod's --slot-save-path and agent folder (pod names are stable)
    <state>/lock               held (flock) by the one `up` using the folder; it names that process
    <state>/prefix-key         the index's block-hash key (0600): kept, like the snapshots whose
                               block chains it made, so a later run's resync still finds them
    <state>/manifest-key       the agents' manifest-signing secret (0600, `--signing-key-file`): the
                               agent token is new at every run, and snapshots signed with a key
                               derived from it would be refused (and deleted) by the next run

Two runs in one folder would overwrite each other's files and evict each other's snapshots, so the
second one is refused (`StateLocked`) while the first holds the lock. The kernel drops an flock when
its holder dies, even by SIGKILL, so a crashed run never leaves the folder locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
from pathlib import Path

from llamafleet_agent.files import model_digest
from llamafleet_local.cache import cache_root

DIGEST_CHARS = 16
LOCK_FILE = "lock"
PREFIX_KEY_FILE = "prefix-key"
MANIFEST_KEY_FILE = "manifest-key"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def prefix_key(state_dir: Path) -> str:
    """The fleet's prefix hash key from `<state>/prefix-key`, made (random, 0600) the first time."""
    path = state_dir / PREFIX_KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        if key := path.read_text().strip():
            return key
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key)
    return key


def manifest_key_file(state_dir: Path) -> Path:
    """`<state>/manifest-key`, made (random, 0600) the first time; the agents read it themselves."""
    path = state_dir / MANIFEST_KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        if path.read_text().strip():
            return path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32))
    return path


class StateLocked(RuntimeError):
    """Another `up` holds the state folder; the message names the folder and the way out."""


def states_root(cache: Path | None = None) -> Path:
    return (cache if cache is not None else cache_root()) / "state"


def default_state_dir(fleet: str, digest: str, cache: Path | None = None) -> Path:
    """`<cache>/state/<fleet>-<first 16 hex of the model's sha256>` (pure)."""
    return states_root(cache) / f"{_UNSAFE.sub('_', fleet)}-{digest[:DIGEST_CHARS]}"


def pod_snapshot_dir(state_dir: Path, pod: str) -> Path:
    return state_dir / "snapshots" / pod


async def model_sha256(model: Path, cache: Path | None = None) -> str:
    """The model file's sha256, as the agent computes it (`llamafleet_agent.files.model_digest`): hashed
    once, then remembered per model path, keyed by size and mtime, so a multi-GiB model costs a stat
    on every later start."""
    model, remembered = _remembered_digest(model, cache)
    return await model_digest(model, remembered)


def _remembered_digest(model: Path, cache: Path | None) -> tuple[Path, Path]:
    """(the model's absolute path, the file its digest is remembered in: one per path)."""
    model = Path(os.path.abspath(model))
    key = hashlib.sha256(str(model).encode()).hexdigest()[:DIGEST_CHARS]
    remembered = states_root(cache) / ".digests" / f"{key}.json"
    remembered.parent.mkdir(parents=True, exist_ok=True)
    return model, remembered


def choose_state_dir(fleet: str, run_dir: Path, *, state_dir: Path | None, keep: bool,
                     digest: str | None) -> Path:
    """`state_dir` when given (made absolute: it is printed and recorded), else with `keep` the fleet's
    default folder for the model of sha256 `digest`, else the run folder."""
    if state_dir is not None:
        return Path(os.path.abspath(os.path.expanduser(state_dir)))
    if keep:
        assert digest, "the default state folder is named by the model's digest"
        return default_state_dir(fleet, digest.lower())
    return run_dir


async def open_state(fleet: str, model: Path, run_dir: Path, *, state_dir: Path | None, keep: bool,
                     digest: str | None = None) -> StateLock:
    """The state folder (`choose_state_dir`), locked; `StateLocked` when another `up` holds it.
    `digest`: the model's sha256 when the spec gives it (the agents then take it too), else `model`
    is hashed when its digest names the folder."""
    if keep and state_dir is None and not digest:
        digest = await model_sha256(model)
    lock = StateLock(choose_state_dir(fleet, run_dir, state_dir=state_dir, keep=keep, digest=digest))
    lock.acquire()
    return lock


class StateLock:
    """An exclusive, non-blocking flock on `<state>/lock`, held from `acquire` to `release`. The file
    descriptor is not inherited by children (Python opens it close-on-exec), so a child that outlived
    its `up` would not keep the folder locked."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StateLocked(
                f"the state folder {self.state_dir} is in use by another `llamafleet up` of this fleet"
                f"{f' ({holder})' if holder else ''}: stop it, or give this one another folder with "
                "--state-dir DIR") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Unlock (idempotent). The file stays: a run that opened it a moment before would otherwise
        lock a file that no later run sees."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return os.pread(fd, 64, 0).decode().strip()
    return ""

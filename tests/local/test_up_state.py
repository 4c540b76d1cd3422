"""The state folder (name, digest, lock), the bounded stop and the death signal of `up`'s children,
without llama-server: what `test_up_state_real.py` and `test_up_strays_real.py` rely on."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llamafleet_local.cache import ENV_CACHE
from llamafleet_local.up.cli import options
from llamafleet_local.up.pods import layout
from llamafleet_local.up.procs import dying_with_parent
from llamafleet_local.up.shutdown import CANCELLED_S, Step, bounded, run_steps
from llamafleet_local.up.state import StateLock, StateLocked, default_state_dir, model_sha256, open_state
from tests.local.up_bed import alive, wait_gone

DIGEST = "ab" * 32


def test_the_default_state_folder_is_per_fleet_and_model(tmp_path: Path) -> None:
    assert default_state_dir("coding", DIGEST, tmp_path) == tmp_path / "state" / f"coding-{'ab' * 8}"
    assert default_state_dir("a/../b c", DIGEST, tmp_path).name == f"a_.._b_c-{'ab' * 8}"
    pod = layout("coding", 1, tmp_path / "run", tmp_path / "st")
    assert pod.snapshot_dir == tmp_path / "st" / "snapshots" / "coding-1" and pod.log_dir == tmp_path / "run"
    assert layout("coding", 1, tmp_path / "run").snapshot_dir == tmp_path / "run" / "snapshots" / "coding-1"


async def test_the_model_digest_is_the_files_sha256_and_is_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    want = hashlib.sha256(model.read_bytes()).hexdigest()
    assert await model_sha256(model, tmp_path / "cache") == want
    # Same size and mtime: the remembered digest is used, the file is not read again.
    stat = model.stat()
    model.write_bytes(b"FUGG" + model.read_bytes()[4:])
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert await model_sha256(model, tmp_path / "cache") == want
    folder = await open_state("t", model, tmp_path / "run", state_dir=None, keep=True)
    try:
        assert folder.state_dir.name == f"t-{want[:16]}"
    finally:
        folder.release()


async def test_a_spec_digest_names_the_folder_and_without_keep_it_is_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    model = tmp_path / "absent.gguf"  # never read: the digest is given
    given = await open_state("t", model, tmp_path / "run", state_dir=None, keep=True, digest=DIGEST.upper())
    given.release()
    assert given.state_dir.name == f"t-{'ab' * 8}"
    run = await open_state("t", model, tmp_path / "run", state_dir=None, keep=False)
    run.release()
    assert run.state_dir == tmp_path / "run"


def test_one_state_folder_serves_one_up_at_a_time(tmp_path: Path) -> None:
    first, second = StateLock(tmp_path / "s"), StateLock(tmp_path / "s")
    first.acquire()
    try:
        with pytest.raises(StateLocked) as refused:
            second.acquire()
        message = str(refused.value)
        assert str(tmp_path / "s") in message and "--state-dir" in message and f"pid {os.getpid()}" in message
        assert not second.held
    finally:
        first.release()
    second.acquire()  # free again once released
    second.release()
    second.release()  # idempotent


def test_a_dead_holder_leaves_the_folder_free(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from llamafleet_local.up.state import StateLock
        StateLock(Path({str(tmp_path / "s")!r})).acquire()
        print("locked", flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        with pytest.raises(StateLocked):
            StateLock(tmp_path / "s").acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = StateLock(tmp_path / "s")
    lock.acquire()  # the kernel dropped the dead holder's flock
    lock.release()


def test_up_keeps_snapshots_by_default_and_takes_a_state_dir(tmp_path: Path) -> None:
    _, opts = options(["-f", "fleet.yaml"])
    assert opts.keep_snapshots and opts.state_dir is None
    _, opts = options(["-f", "fleet.yaml", "--state-dir", str(tmp_path)])
    assert opts.state_dir == tmp_path


async def test_a_step_that_swallows_its_cancel_is_cut_off_and_the_next_steps_run() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # swallows the cancel, as routers' code can
                await released.wait()

    async def failing() -> None:
        raise RuntimeError("boom")

    ran: list[str] = []

    async def last() -> None:
        ran.append("last")

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await bounded(stubborn(), 0.2)
    assert time.monotonic() - started < 0.2 + CANCELLED_S + 0.3
    problems = await run_steps([Step("stubborn", stubborn, 0.2), Step("failing", failing, 1.0),
                                Step("last", last, 1.0)], lambda _line: None)
    assert ran == ["last"] and [p.split(":")[0] for p in problems] == ["stubborn", "failing"]
    released.set()  # the stubborn ones end: a test loop closing would wait for them forever
    await asyncio.sleep(0)


# The parent: starts `sleep` with the death signal, prints its pid, and waits to be killed.
PARENT = """
import subprocess, sys
from llamafleet_local.up.procs import dying_with_parent
child = subprocess.Popen(["sleep", "60"], preexec_fn=dying_with_parent())
print(child.pid, flush=True)
child.wait()
"""

# The same, for the embedded redis-server as `up` starts it.
REDIS_PARENT = """
import sys, time
from pathlib import Path
from llamafleet_local.redis_server import RedisServer
from llamafleet_local.up.procs import dying_with_parent
server = RedisServer(Path(sys.argv[1]), preexec=dying_with_parent())
server.spawn()
server.wait_ready()
print(server.proc.pid, flush=True)
time.sleep(60)
"""


def _orphaned_child_dies(script: str, *args: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert not wait_gone([child], timeout=10), f"{child} outlived its parent's SIGKILL"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_parent() -> None:
    _orphaned_child_dies(PARENT)


@pytest.mark.redis
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_embedded_redis_server_dies_with_its_parent(tmp_path: Path) -> None:
    _orphaned_child_dies(REDIS_PARENT, str(tmp_path))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_whose_parent_died_before_its_prctl_exits_at_once() -> None:
    """The death signal is only armed for the parent of the moment: a child reparented before its
    prctl ran would wait forever. Simulated: the preexec was made in this process, the fork happens
    in a child of it, so the grandchild's parent is not the one the preexec expects."""
    preexec = dying_with_parent()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child
        code = 3
        try:
            code = subprocess.Popen(["sleep", "60"], preexec_fn=preexec).wait(timeout=10)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1

"""Hermes Agent, a real agent client, in the test bed: installed once, run as one-shot sessions.

`install()` puts the pinned `hermes-agent`, `libfaketime` (PyPI; it vendors libfaketime, so no apt
package is needed) and `edge-tts` (`EXTRA_PACKAGES`) into their own virtual environment under the
project's cache and reuses it once its marker file is there. `HermesClient.chat()` runs
`hermes chat -q QUESTION` in a workspace folder against an OpenAI-compatible base URL, optionally on a
faked date (libfaketime moves the clock of the Hermes process only), with a HERMES_HOME of its own that
keeps Hermes off the network.

`python -m llamafleet_testbed.hermes_capture OUT.json` runs one session against a capture server and
writes the layout that `hermes_layout` replays, to refresh the committed one for a newer Hermes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llamafleet_local.cache import cache_root, log

HERMES_VERSION = "0.19.0"
# libfaketime fakes the date of a session. edge-tts is what Hermes itself pip-installs on its first start
# (the pin of its lazy installer for the default speech backend, `tts.edge`) when the network lets it:
# installed up front, a user's tool set (18 tools, with `text_to_speech`) is what every session sees,
# while the sessions here run with Hermes's lazy installs off.
EXTRA_PACKAGES = ("libfaketime==3.0.1", "edge-tts==7.2.7")
MARKER = ".installed.json"
_FAKETIME_LIB = "libfaketime/vendor/libfaketime/src/libfaketime.so.1"


class HermesError(RuntimeError):
    """Hermes could not be installed or started; the message says which step and where its log is."""


@dataclass(frozen=True)
class HermesInstall:
    """An installed Hermes: its venv and the libfaketime library that fakes its clock."""

    root: Path
    version: str
    faketime_lib: Path

    @property
    def hermes(self) -> Path:
        return self.root / "venv" / "bin" / "hermes"


def install_dir(version: str = HERMES_VERSION) -> Path:
    return cache_root() / f"hermes-{version}"


def install(version: str = HERMES_VERSION, root: Path | None = None) -> HermesInstall:
    """The Hermes venv under the cache, installed with pip on first use (a few minutes), else reused."""
    root = root or install_dir(version)
    marker = root / MARKER
    if (found := _read_marker(marker, version)) is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    # Two test runs may ask at once: one installs, the other waits and reuses.
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (found := _read_marker(marker, version)) is not None:
            return found
        return _install_into(root, version)


def _read_marker(marker: Path, version: str) -> HermesInstall | None:
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    found = HermesInstall(marker.parent, data.get("version", ""), Path(data.get("faketime_lib", "")))
    if found.version != version or data.get("packages") != list(EXTRA_PACKAGES):
        return None
    if not found.hermes.is_file() or not found.faketime_lib.is_file():
        return None
    return found


def _install_into(root: Path, version: str) -> HermesInstall:
    venv, logfile = root / "venv", root / "install.log"
    shutil.rmtree(venv, ignore_errors=True)  # a half-made venv from an interrupted install
    log(f"installing hermes-agent=={version} and {', '.join(EXTRA_PACKAGES)} into {venv} (log: {logfile})")
    steps = (
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
         "--progress-bar", "off", f"hermes-agent=={version}", *EXTRA_PACKAGES],
    )
    with logfile.open("w") as out:
        for cmd in steps:
            started = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                # The packages asked for, not every dependency: a few lines of progress, not a hundred.
                if line.startswith(("Collecting ", "Installing collected")) and "(from " not in line:
                    log("  " + line.rstrip()[:120])
            if proc.wait() != 0:
                raise HermesError(f"`{' '.join(cmd[:4])} ...` failed; the full log is {logfile}")
            log(f"  done in {time.monotonic() - started:.0f}s")
    libs = sorted(venv.glob(f"lib/python*/site-packages/{_FAKETIME_LIB}"))
    if not libs:
        raise HermesError(f"libfaketime installed but {_FAKETIME_LIB} is not in {venv}; see {logfile}")
    found = HermesInstall(root, version, libs[0])
    if not found.hermes.is_file():
        raise HermesError(f"hermes-agent installed but {found.hermes} is missing; see {logfile}")
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"version": version, "packages": list(EXTRA_PACKAGES),
                               "faketime_lib": str(found.faketime_lib)}))
    tmp.rename(root / MARKER)  # written last: a marker means the whole install succeeded
    return found


# --- one-shot sessions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionResult:
    returncode: int  # -9 (killed) when it ran past its timeout
    stdout: str  # the last few KB of each
    stderr: str
    seconds: float
    timed_out: bool = False
    attempts: int = 1  # more than one: Hermes crashed on start and was run again (`crash_retries`)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class HermesClient:
    """One user's Hermes, configured for one endpoint and model.

    `home` is the user's home folder (HOME); HERMES_HOME is `home/.hermes`, Hermes's own default, so
    what the system prompt says of both is what a real user's says. The config turns off what would
    reach the network on its own (lazy pip installs, the tirith scanner's download), and each session
    runs with its proxies pointed at a port that refuses, so update checks and model-metadata look-ups
    fail at once instead of leaving the machine; only `base_url`'s host is reached directly.
    """

    def __init__(self, install: HermesInstall, home: Path, *, base_url: str, model: str,
                 provider: str = "custom", api_key: str = "llamafleet",
                 max_tokens: int | None = None) -> None:
        self.install = install
        self.home = home
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.provider = provider
        self.api_key = api_key
        # Hermes asks for 65536 tokens by default, and llama-server lets a request's limit override its
        # own `--n-predict`: a random-weight test model would write until its context is full.
        self.max_tokens = max_tokens

    @property
    def hermes_home(self) -> Path:
        return self.home / ".hermes"

    def configure(self) -> Path:
        """Write HERMES_HOME/config.yaml (again: it is cheap, and a session may have rewritten it)."""
        model: dict[str, Any] = {"provider": self.provider, "base_url": self.base_url, "default": self.model}
        if self.max_tokens is not None:
            model["max_tokens"] = self.max_tokens
        config = {"model": model, "security": {"allow_lazy_installs": False, "tirith_enabled": False}}
        self.hermes_home.mkdir(parents=True, exist_ok=True)
        path = self.hermes_home / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def env(self, *, day: dt.date | None = None, proxy: str | None = None) -> dict[str, str]:
        """The session's whole environment: nothing of the caller's (its venv, its keys) leaks in."""
        host = urllib.parse.urlsplit(self.base_url).hostname or "127.0.0.1"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
            "HERMES_HOME": str(self.hermes_home), "LANG": "C.UTF-8", "TZ": "UTC", "TERM": "dumb",
            "NO_COLOR": "1", "CUSTOM_BASE_URL": self.base_url, "HERMES_INFERENCE_MODEL": self.model,
            "OPENAI_API_KEY": self.api_key, "HERMES_DISABLE_LAZY_INSTALLS": "1",
            # A crash (rare: once in some twenty sessions under libfaketime) then leaves a traceback.
            "PYTHONFAULTHANDLER": "1",
        }
        if proxy is not None:
            no_proxy = ",".join(dict.fromkeys((host, "127.0.0.1", "localhost")))
            for name in ("http_proxy", "https_proxy", "all_proxy"):
                env[name] = env[name.upper()] = proxy
            env["no_proxy"] = env["NO_PROXY"] = no_proxy
        if day is not None:
            # Noon UTC: the same date in every time zone a test might assume. The clock runs on from
            # there; monotonic clocks stay real, so timeouts inside Hermes keep their meaning. The
            # other two are what the libfaketime package itself sets for a Python process.
            env["LD_PRELOAD"] = str(self.install.faketime_lib)
            env["FAKETIME"] = f"@{day.isoformat()} 12:00:00"
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = env["DONT_FAKE_MONOTONIC"] = "1"
            env["FAKETIME_NO_CACHE"] = "1"
            env["FAKETIME_FORCE_MONOTONIC_FIX"] = "0"
        return env

    def chat(self, question: str, workspace: Path, *, day: dt.date | None = None, timeout: float = 300.0,
             extra_args: Sequence[str] = (), proxy: str | None = None,
             crash_retries: int = 1) -> SessionResult:
        """`hermes chat -q QUESTION` in `workspace` (a folder the caller made, e.g. `git init`), on `day`
        (None: today). `extra_args` go after the question (e.g. `--pass-session-id`). `proxy`: where
        Hermes's other traffic goes (default: a port that refuses it). A Hermes killed by a signal not
        of our sending (a SIGSEGV under libfaketime, about once in twenty sessions on a busy machine)
        is started again, up to `crash_retries` times; `SessionResult.attempts` counts the runs."""
        for attempt in range(1, crash_retries + 2):
            result = self._run(question, workspace, day=day, timeout=timeout, extra_args=extra_args,
                               proxy=proxy)
            result = dataclasses.replace(result, attempts=attempt)
            if result.returncode >= 0 or result.timed_out or attempt > crash_retries:
                return result
            log(f"hermes died of signal {-result.returncode} after {result.seconds:.1f}s; starting it again")
        raise AssertionError("unreachable")

    def _run(self, question: str, workspace: Path, *, day: dt.date | None, timeout: float,
             extra_args: Sequence[str], proxy: str | None) -> SessionResult:
        self.configure()
        cmd = [str(self.install.hermes), "chat", "-q", question, *extra_args]
        with _refusing_port() as refused:
            env = self.env(day=day, proxy=proxy or f"http://127.0.0.1:{refused}")
            started = time.monotonic()
            # A session of its own: on a timeout the whole process group goes, tools Hermes ran included.
            proc = subprocess.Popen(cmd, cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                out, err = proc.communicate(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                timed_out = True
        return SessionResult(proc.returncode, _tail(out), _tail(err), time.monotonic() - started, timed_out)


def git_workspace(path: Path) -> Path:
    """A workspace as real users have one: a folder under `git init` (empty: Hermes then stays out of
    its coding posture, whose brief and git snapshot would join the system prompt)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def _tail(data: bytes, limit: int = 4000) -> str:
    return data[-limit:].decode("utf-8", "replace")


@contextlib.contextmanager
def _refusing_port() -> Iterator[int]:
    """A port bound but never listening: every connection to it is refused at once, and no other
    process can take it while the session runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()


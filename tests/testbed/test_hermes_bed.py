"""The Hermes test bed's own parts, without Hermes: the capture server, the session environment, the
install's reuse of a finished install."""

from __future__ import annotations

import datetime as dt
import json
import socket
from http.client import HTTPConnection
from pathlib import Path

import httpx
import pytest
import yaml

from llamafleet_testbed import hermes
from llamafleet_testbed.hermes import EXTRA_PACKAGES, MARKER, HermesClient, HermesInstall, install
from llamafleet_testbed.hermes_capture import CaptureServer


def test_the_capture_server_answers_like_an_openai_server_and_records_every_request() -> None:
    with CaptureServer(answer="4", model="tiny") as cap, httpx.Client(timeout=10) as http:
        assert http.post(cap.url + "/api/show", json={"name": "tiny"}).status_code == 404
        assert http.get(cap.base_url + "/models").json()["data"][0]["id"] == "tiny"
        body = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "What is 2+2?"}]}
        with http.stream("POST", cap.base_url + "/chat/completions", json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "4"
        assert chunks[-1]["usage"]["completion_tokens"] == 1
        plain = http.post(cap.base_url + "/chat/completions", json={**body, "stream": False}).json()
        assert plain["choices"][0]["message"]["content"] == "4"

        conn = HTTPConnection("127.0.0.1", int(cap.url.rsplit(":", 1)[1]), timeout=10)
        conn.request("CONNECT", "example.invalid:443")
        assert conn.getresponse().status == 403
        conn.close()
    assert [f"{r.method} {r.path}" for r in cap.requests] == [
        "POST /api/show", "GET /v1/models", "POST /v1/chat/completions", "POST /v1/chat/completions",
        "CONNECT example.invalid:443"]
    assert cap.chat_requests() == [body, {**body, "stream": False}]


def _install(tmp_path: Path) -> HermesInstall:
    lib = tmp_path / "libfaketime.so.1"
    lib.write_bytes(b"")
    return HermesInstall(tmp_path, "0.19.0", lib)


def test_a_session_environment_holds_nothing_of_the_callers_and_fakes_only_the_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-callers-own")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    client = HermesClient(_install(tmp_path), tmp_path / "home", base_url="http://127.0.0.1:8000/v1/",
                          model="tiny")
    env = client.env(day=dt.date(2026, 12, 5), proxy="http://127.0.0.1:9")
    assert env["OPENAI_API_KEY"] == "llamafleet" and "PYTHONPATH" not in env
    assert env["HOME"] == str(tmp_path / "home") and env["HERMES_HOME"] == str(tmp_path / "home/.hermes")
    assert env["CUSTOM_BASE_URL"] == "http://127.0.0.1:8000/v1" and env["HERMES_INFERENCE_MODEL"] == "tiny"
    assert env["FAKETIME"] == "@2026-12-05 12:00:00" and env["LD_PRELOAD"].endswith("libfaketime.so.1")
    assert env["https_proxy"] == env["HTTP_PROXY"] == "http://127.0.0.1:9"
    assert env["no_proxy"] == "127.0.0.1,localhost"
    assert "LD_PRELOAD" not in client.env() and "https_proxy" not in client.env()

    config = yaml.safe_load(client.configure().read_text())
    assert config["model"] == {"provider": "custom", "base_url": "http://127.0.0.1:8000/v1",
                               "default": "tiny"}
    assert config["security"] == {"allow_lazy_installs": False, "tirith_enabled": False}


def test_the_proxy_port_refuses_connections_while_the_session_runs() -> None:
    with hermes._refusing_port() as port, pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_install_reuses_a_finished_install_and_redoes_an_unfinished_or_older_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    done = _install(tmp_path)
    done.hermes.parent.mkdir(parents=True)
    done.hermes.write_text("#!/bin/sh\n")
    installs: list[Path] = []

    def install_into(root: Path, version: str) -> HermesInstall:
        installs.append(root)
        return done

    monkeypatch.setattr(hermes, "_install_into", install_into)
    assert install(root=tmp_path) == done and installs == [tmp_path]  # no marker: not finished

    marker = {"version": "0.19.0", "packages": list(EXTRA_PACKAGES), "faketime_lib": str(done.faketime_lib)}
    (tmp_path / MARKER).write_text(json.dumps(marker))
    assert install(root=tmp_path) == done and len(installs) == 1  # reused, nothing installed
    for stale in ({"version": "0.18.0"}, {"packages": ["libfaketime==3.0.1"]}):
        (tmp_path / MARKER).write_text(json.dumps({**marker, **stale}))
        install(root=tmp_path)
    assert len(installs) == 3
    (tmp_path / MARKER).write_text(json.dumps(marker))
    done.faketime_lib.unlink()  # a marker whose files are gone is no install
    install(root=tmp_path)
    assert len(installs) == 4


def _fake_hermes(tmp_path: Path, script: str) -> HermesInstall:
    """An install whose `hermes` is a shell script: `chat()` runs it as it would run Hermes."""
    found = _install(tmp_path)
    found.hermes.parent.mkdir(parents=True, exist_ok=True)
    found.hermes.write_text("#!/bin/sh\n" + script)
    found.hermes.chmod(0o755)
    return found


def test_a_session_runs_in_its_workspace_with_its_config_and_is_started_again_after_a_crash(
    tmp_path: Path,
) -> None:
    """The first run dies of SIGSEGV (as Hermes rarely does under libfaketime), the second answers."""
    script = ('[ -f "$HOME/crashed" ] || { touch "$HOME/crashed"; kill -SEGV $$; }\n'
              'echo "cwd=$(pwd) q=$3 config=$(cat "$HERMES_HOME/config.yaml" | head -1)"\n')
    client = HermesClient(_fake_hermes(tmp_path, script), tmp_path / "home", base_url="http://127.0.0.1:1/v1",
                          model="tiny")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = client.chat("What is 2+2?", workspace, day=dt.date(2026, 12, 2))
    assert result.ok and result.attempts == 2, result
    assert result.stdout.strip() == f"cwd={workspace} q=What is 2+2? config=model:"

    once = client.chat("Again?", workspace, crash_retries=0)
    assert once.ok and once.attempts == 1


def test_a_session_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    client = HermesClient(_fake_hermes(tmp_path, "sleep 30 & sleep 30\n"), tmp_path / "home",
                          base_url="http://127.0.0.1:1/v1", model="tiny")
    result = client.chat("Hi", tmp_path, timeout=0.5)
    assert result.timed_out and not result.ok and result.attempts == 1 and result.seconds < 10

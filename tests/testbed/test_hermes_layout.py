"""The committed Hermes Agent capture (package data) and the profile that replays it, without Hermes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re

import pytest

from llamafleet_testbed.hermes import HERMES_VERSION
from llamafleet_testbed.hermes_layout import (
    NEUTRAL_HOME,
    LayoutChanged,
    fill_all,
    hermes_date,
    hermes_profile,
    layout_from_request,
    load_layout,
)
from llamafleet_testbed.workload import WorkloadSpec, next_day

SPEC = WorkloadSpec(workspace="/home/dev/projects/service", day=dt.date(2026, 12, 1))


def test_the_committed_capture_loads_with_18_tools_and_the_request_fields_hermes_sends() -> None:
    layout = load_layout()
    assert layout["client"] == "hermes-agent" and layout["version"] == HERMES_VERSION  # the one installed
    names = [t["function"]["name"] for t in layout["tools"]]
    assert len(names) == 18 and len(set(names)) == 18 and "text_to_speech" in names
    assert 40_000 < len(json.dumps(layout["tools"])) < 60_000
    assert layout["request"] == {"stream": True, "stream_options": {"include_usage": True}}
    assert layout["max_tokens"] == 65536


def test_a_day_1_and_a_day_2_prompt_differ_only_in_the_date_line() -> None:
    day1, day2 = hermes_profile(SPEC), hermes_profile(next_day(SPEC))
    assert day1.tools == day2.tools
    a, b = day1.system_prompt.splitlines(), day2.system_prompt.splitlines()
    changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    assert len(a) == len(b) and len(changed) == 1
    assert a[changed[0]] == "Conversation started: Tuesday, December 01, 2026"
    assert b[changed[0]] == "Conversation started: Wednesday, December 02, 2026"
    assert a[-3:] == ["Conversation started: Tuesday, December 01, 2026", "Model: tiny", "Provider: custom"]


def test_the_rendered_prefix_has_no_placeholder_left_and_no_machine_of_its_own() -> None:
    profile = hermes_profile(SPEC, model="tiny-hybrid")
    text = profile.system_prompt + json.dumps(profile.tools)
    assert "{{" not in text and "llamafleet:" not in text
    system = profile.system_prompt
    assert f"User home directory: {NEUTRAL_HOME}\n" in system
    assert f"Current working directory: {SPEC.workspace}\n" in system
    assert f"live under {NEUTRAL_HOME}/.hermes/profiles/<name>/" in system
    assert re.search(r"^Host: Linux \(6\.8\.0-49-generic\)$", system, re.MULTILINE)
    assert system.endswith("\nModel: tiny-hybrid\nProvider: custom")
    assert "~/.hermes/skills/" in json.dumps(profile.tools)  # Hermes writes its home-relative form


def test_the_request_has_hermes_shape_with_the_callers_max_tokens() -> None:
    body = hermes_profile(SPEC).request("tiny", "What is 2+2?", max_tokens=8)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and "temperature" not in body and "seed" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"] and len(body["tools"]) == 18
    plain = hermes_profile(SPEC).request("tiny", "Hi", stream=False)
    assert plain["stream"] is False and "stream_options" not in plain


def test_workspace_model_and_session_id_land_where_hermes_puts_them() -> None:
    other = hermes_profile(dataclasses.replace(SPEC, workspace="/home/dev/projects/web"), model="m2",
                           session_id="20261201_100000_abc123")
    lines = other.system_prompt.splitlines()
    assert "Current working directory: /home/dev/projects/web" in lines
    assert lines[-4:] == ["Conversation started: Tuesday, December 01, 2026",
                          "Session ID: 20261201_100000_abc123", "Model: m2", "Provider: custom"]


def test_hermes_date_pads_the_day_like_strftime() -> None:
    assert hermes_date(dt.date(2026, 12, 5)) == "Saturday, December 05, 2026"
    assert hermes_date(dt.date(2026, 12, 5)) == dt.date(2026, 12, 5).strftime("%A, %B %d, %Y")


def _captured(values: dict[str, str]) -> dict[str, object]:
    """A request as Hermes would have sent it on a machine with `values`: the committed layout filled."""
    layout = load_layout()
    return {"messages": [{"role": "system", "content": fill_all(layout["system_prompt"], values)},
                         {"role": "user", "content": "What is 2+2?"}],
            "model": values["model"], "max_tokens": 65536, **layout["request"],
            "tools": fill_all(layout["tools"], values)}


def test_a_capture_turns_back_into_the_committed_template() -> None:
    """What the capture command does with Hermes's request: every machine value back to its mark."""
    home = "/scratch/capture/home/dev"
    values = {"kernel": "6.1.0-9-amd64", "home": home, "cwd": f"{home}/projects/service",
              "hermes_home": f"{home}/.hermes", "date": "Tuesday, December 01, 2026",
              "model": "tiny", "provider": "custom"}
    machine = {k: v for k, v in values.items() if k != "date"}
    rebuilt = layout_from_request(_captured(values), machine, version="0.19.0")
    committed = load_layout()
    for key in ("system_prompt", "tools", "request", "max_tokens", "question", "placeholders"):
        assert rebuilt[key] == committed[key], key


def test_a_short_home_is_replaced_only_as_a_whole_path() -> None:
    """`/h` as the home: `https://hermes-agent...` in Hermes's text keeps its `/h`."""
    values = {"kernel": "6.1.0-9-amd64", "home": "/h", "cwd": "/h/w", "hermes_home": "/h/.hermes",
              "date": "Tuesday, December 01, 2026", "model": "tiny", "provider": "custom"}
    machine = {k: v for k, v in values.items() if k != "date"}
    assert layout_from_request(_captured(values), machine, version="0.19.0")["system_prompt"] == \
        load_layout()["system_prompt"]


def test_a_capture_without_the_expected_lines_is_refused() -> None:
    values = {"kernel": "6.1.0-9-amd64", "home": "/h", "cwd": "/h/w", "hermes_home": "/h/.hermes",
              "date": "Tuesday, December 01, 2026", "model": "tiny", "provider": "custom"}
    machine = {k: v for k, v in values.items() if k != "date"}
    with pytest.raises(LayoutChanged, match="model"):
        layout_from_request(_captured(values), {**machine, "model": "other"}, version="0.19.0")

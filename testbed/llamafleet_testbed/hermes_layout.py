"""Hermes Agent's real request layout, replayed without running Hermes.

`hermes_layout.json` (next to this module) holds one request Hermes sent at the start of a session,
captured by `python -m llamafleet_testbed.hermes_capture OUT.json`: its tools verbatim and its system
prompt, with what varies per machine, user, folder and day replaced by placeholders `{{llamafleet:NAME}}`
(`PLACEHOLDERS`). `hermes_profile(spec, model=...)` fills them for one workspace and one day, so
`next_day(spec)` gives the next day's prefix exactly as Hermes would send it. Neutral values stand in for
the machine's own (a home of /home/dev, a common kernel string).

Hermes ends its system prompt with `...Host: Linux (<kernel>)\nUser home directory: <home>\nCurrent
working directory: <cwd>\n\nActive Hermes profile: ... <HERMES_HOME>/profiles/<name>/ ...\n\n<CLI
paragraph>\n\nConversation started: <date>\nModel: <model>\nProvider: <provider>`. Its tools (18, about
48K characters) name HERMES_HOME as `~/.hermes/...`, home-relative, so for users with the default
HERMES_HOME the whole prefix up to the `Host:` line is the same on every machine; the date comes two
lines before the end. (`hermes_home=` changes only the system prompt's mention: Hermes would write an
absolute path into the tools too for a HERMES_HOME outside the home.)
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from llamafleet_testbed.workload import AgentProfile, WorkloadSpec

LAYOUT_FILE = "hermes_layout.json"
PLACEHOLDERS = ("kernel", "home", "cwd", "hermes_home", "date", "model", "provider")
NEUTRAL_HOME = "/home/dev"
NEUTRAL_KERNEL = "6.8.0-49-generic"
_MARK = re.compile(r"\{\{llamafleet:(\w+)\}\}")


def mark(name: str) -> str:
    return "{{llamafleet:" + name + "}}"


def hermes_date(day: dt.date) -> str:
    """The date as Hermes writes it (`strftime('%A, %B %d, %Y')`, zero-padded day, C locale)."""
    return f"{day:%A}, {day:%B} {day.day:02d}, {day.year}"


@dataclass(frozen=True)
class ClientProfile(AgentProfile):
    """A real client's prefix, with the other fields of its request (`fields`: stream options and the
    like) instead of the generator's temperature and seed."""

    fields: Mapping[str, Any] = field(default_factory=dict)

    def request(
        self, model: str, user: str, *, history: tuple[dict[str, Any], ...] = (),
        max_tokens: int = 16, stream: bool = True,
    ) -> dict[str, Any]:
        """The request as the client sends it, with `max_tokens` capped by the caller (Hermes asks
        for 65536; a bench on a tiny model cannot let it generate that long)."""
        body: dict[str, Any] = {"model": model, "messages": self.messages(user, history),
                                "tools": list(self.tools), "max_tokens": max_tokens}
        body.update({k: v for k, v in self.fields.items() if k not in body})
        body["stream"] = stream
        if not stream:
            body.pop("stream_options", None)
        return body


def load_layout() -> dict[str, Any]:
    """The committed capture (package data)."""
    text = resources.files("llamafleet_testbed").joinpath(LAYOUT_FILE).read_text(encoding="utf-8")
    layout: dict[str, Any] = json.loads(text)
    return layout


def hermes_profile(spec: WorkloadSpec | None = None, *, model: str = "tiny", provider: str = "custom",
                   home: str = NEUTRAL_HOME, kernel: str = NEUTRAL_KERNEL, hermes_home: str | None = None,
                   session_id: str | None = None, layout: Mapping[str, Any] | None = None) -> ClientProfile:
    """Hermes's prefix for `spec.workspace` on `spec.day` (the spec's sizes and seed do not apply: the
    layout is the real one). `session_id`: the `Session ID:` line Hermes adds after the date when run
    with `--pass-session-id`."""
    spec = spec or WorkloadSpec()
    layout = layout if layout is not None else load_layout()
    values = {"kernel": kernel, "home": home, "cwd": spec.workspace,
              "hermes_home": hermes_home or f"{home}/.hermes", "date": hermes_date(spec.day),
              "model": model, "provider": provider}
    system = fill(layout["system_prompt"], values)
    if session_id is not None:
        started = f"Conversation started: {values['date']}"
        system = system.replace(started, f"{started}\nSession ID: {session_id}", 1)
    tools = tuple(fill_all(tool, values) for tool in layout["tools"])
    return ClientProfile(tools=tools, system_prompt=system, fields=dict(layout.get("request", {})))


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace every placeholder; one without a value is an error, never left in a prompt."""
    def value(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"no value for placeholder {m.group(0)}")
        return values[m.group(1)]
    return _MARK.sub(value, text)


def fill_all(obj: Any, values: Mapping[str, str]) -> Any:
    return _walk(obj, lambda s: fill(s, values))


def _walk(obj: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    return obj


# --- from a captured request to the committed layout -------------------------------------------------


class LayoutChanged(ValueError):
    """The captured request does not have the lines this module expects: Hermes changed its layout."""


def layout_from_request(body: Mapping[str, Any], machine: Mapping[str, str], *,
                        version: str) -> dict[str, Any]:
    """Turn one captured chat request into the layout file's content. `machine` holds the values the
    session ran with (every name of `PLACEHOLDERS` but `date`, which is found by its line). Paths are
    replaced wherever they occur, longest first (the working directory and HERMES_HOME lie under the
    home); the kernel, model and provider only on their own lines, where Hermes writes them."""
    messages = body["messages"]
    if messages[0].get("role") != "system" or messages[-1].get("role") != "user":
        raise LayoutChanged("expected a system message first and the user's question last")
    raw = json.dumps(body)
    if _MARK.search(raw):
        raise LayoutChanged("the capture already holds placeholder marks")
    lines = {
        "kernel": (rf"^(Host: \w+ \(){re.escape(machine['kernel'])}(\))$", 1),
        "date": (r"^(Conversation started: )\w+, \w+ \d\d, \d{4}()$", 1),
        "model": (rf"^(Model: ){re.escape(machine['model'])}()$", 1),
        "provider": (rf"^(Provider: ){re.escape(machine['provider'])}()$", 1),
    }
    system = messages[0]["content"]
    for name, (pattern, want) in lines.items():
        system, n = re.subn(pattern, rf"\g<1>{mark(name)}\g<2>", system, flags=re.MULTILINE)
        if n != want:
            raise LayoutChanged(f"{name}: expected {want} line(s) matching {pattern!r}, found {n}")
    # A path counts only as a whole path (not inside a longer one, nor in `https://host`).
    paths = [(re.compile(rf"(?<![\w/.-]){re.escape(machine[name])}(?![\w.-])"), mark(name))
             for name in sorted(("cwd", "hermes_home", "home"), key=lambda k: -len(machine[k]))]

    def unpath(text: str) -> str:
        for pattern, replacement in paths:
            text = pattern.sub(replacement, text)  # a mark holds no backslash: taken literally
        return text

    system = unpath(system)
    tools = _walk(body.get("tools", []), unpath)
    for name in ("home", "cwd", "hermes_home"):
        if mark(name) not in system:
            raise LayoutChanged(f"{name} ({machine[name]}) does not occur in the system prompt")
    return {
        "client": "hermes-agent",
        "version": version,
        "placeholders": list(PLACEHOLDERS),
        "request": {k: v for k, v in body.items() if k not in ("messages", "tools", "model", "max_tokens")},
        "max_tokens": body.get("max_tokens"),
        "question": messages[-1]["content"],
        "system_prompt": system,
        "tools": tools,
    }

"""Agent-client-like requests: many tool schemas, a long system prompt, then the conversation.

Real agent clients open every session with the same long prefix: tool schemas (JSON schemas with
descriptions and nested parameters) and a system prompt that ends with a workspace block and a
`Conversation started: <date>` line. Sessions of the same day in the same folder differ only at the
user message; on the next day the date line differs, close to the end of the prefix. This module
makes such requests deterministically (seeded), sized in characters, so tests, the demo and the
benchmarks all replay the same shapes.

Three layouts (`WorkloadSpec.layout`, `LAYOUTS`) put the day where real clients do:

- `date_last` (the default): `...</workspace>\n\nConversation started: <date>`, the date last;
- `env_after_date`: the date line, then an environment block (OS, shell, working directory, git branch
  and status), so the next day differs a few lines before the end;
- `session_after_date`: the date line, then `Session ID: <id>`, an id seeded from the spec (its
  `session` field among them), so two sessions of one day differ after the date too (Hermes Agent
  with `--pass-session-id`).

Sizes: with Qwen tokenizers the JSON of tool schemas runs at about 4.5 characters per token, so
`prefix_chars=62_000` gives roughly the 14K-token prefix of a real client.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_WORDS = (
    "file path line range buffer repository commit branch diff patch test suite module function class "
    "method argument value return error warning config option flag default timeout retry limit offset "
    "query result record index cache entry token prompt session user agent tool call output input "
    "stream chunk request response header status code server client process thread task queue worker "
    "schedule event handler callback resource object field schema type string number boolean array map "
    "list item element node tree graph edge path search pattern match replace read write create delete "
    "update move copy rename open close start stop run build deploy install check verify validate parse "
    "format render encode decode compress extract archive directory folder workspace project document"
).split()

CHARS_PER_TOKEN = 4.4  # measured for Qwen tokenizers on this kind of text; used only for sizing


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def _param(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ("string", "integer", "boolean", "array", "object") if depth < 2 else ("string", "integer")
    kind = rng.choice(kinds)
    schema: dict[str, Any] = {"type": kind, "description": _sentence(rng, rng.randint(8, 24))}
    if kind == "array":
        schema["items"] = _param(rng, depth + 1)
    elif kind == "object":
        props = {f"{rng.choice(_WORDS)}_{i}": _param(rng, depth + 1) for i in range(rng.randint(2, 4))}
        schema["properties"] = props
        schema["required"] = sorted(props)[:1]
    elif kind == "string" and rng.random() < 0.3:
        schema["enum"] = sorted({rng.choice(_WORDS) for _ in range(4)})
    return schema


def make_tool(rng: random.Random, index: int) -> dict[str, Any]:
    name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{index}"
    props = {f"{rng.choice(_WORDS)}_{i}": _param(rng, 0) for i in range(rng.randint(3, 7))}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": " ".join(_sentence(rng, rng.randint(10, 30)) for _ in range(rng.randint(3, 8))),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:2]},
        },
    }


@dataclass(frozen=True)
class AgentProfile:
    """One agent client's fixed prefix: its tools and system prompt for one workspace and one day."""

    tools: tuple[dict[str, Any], ...]
    system_prompt: str

    def messages(self, user: str, history: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
        system = {"role": "system", "content": self.system_prompt}
        return [system, *history, {"role": "user", "content": user}]

    def request(
        self, model: str, user: str, *, history: tuple[dict[str, Any], ...] = (),
        max_tokens: int = 16, stream: bool = True,
    ) -> dict[str, Any]:
        """A chat request as agent clients send it: streaming, usage reported."""
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages(user, history),
            "tools": list(self.tools),
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": 42,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    @property
    def prefix_chars(self) -> int:
        return len(json.dumps(list(self.tools))) + len(self.system_prompt)


@dataclass(frozen=True)
class WorkloadSpec:
    prefix_chars: int = 62_000  # about 14K tokens
    tools_share: float = 0.82  # a real client: 47K of 58K characters are tool schemas
    seed: int = 7
    workspace: str = "/home/dev/projects/service"
    day: dt.date = field(default_factory=lambda: dt.date(2026, 11, 2))
    layout: str = "date_last"  # one of LAYOUTS: where the date sits and what follows it
    session: int = 0  # which session of the day: only `session_after_date` shows it (in its id)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: expected one of {', '.join(LAYOUTS)}")


LAYOUTS = ("date_last", "env_after_date", "session_after_date")


def session_id(spec: WorkloadSpec) -> str:
    """A random-looking id (UUID form) that only the spec decides: same spec, same id."""
    rng = random.Random(f"{spec.seed}|{spec.workspace}|{spec.day.isoformat()}|{spec.session}")
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _closing(spec: WorkloadSpec) -> list[str]:
    """The system prompt's last blocks for the spec's layout: the workspace, the date and what follows."""
    started = "Conversation started: " + spec.day.strftime("%A, %B %d, %Y").replace(" 0", " ")
    workspace = "\n".join((
        "<workspace>", f"Working directory: {spec.workspace}", "Git branch: main", "Platform: linux",
        "</workspace>",
    ))
    if spec.layout == "env_after_date":
        env = "\n".join((
            "<env>", "OS: Linux 6.8.0-49-generic x86_64", "Shell: /bin/bash",
            f"Working directory: {spec.workspace}", "Is a git repository: yes", "Git branch: main",
            "Git status: clean (0 staged, 0 modified, 0 untracked)", "</env>",
        ))
        return [started, env]
    if spec.layout == "session_after_date":
        return [workspace, f"{started}\nSession ID: {session_id(spec)}"]
    return [workspace, started]


def make_profile(spec: WorkloadSpec) -> AgentProfile:
    """Build the tools and system prompt; the same spec always gives the same text."""
    rng = random.Random(spec.seed)
    tools: list[dict[str, Any]] = []
    tools_budget = int(spec.prefix_chars * spec.tools_share)
    while len(json.dumps(tools)) < tools_budget:
        tools.append(make_tool(rng, len(tools)))
    body_budget = spec.prefix_chars - len(json.dumps(tools))
    paragraphs: list[str] = ["You are a coding agent working in the user's workspace."]
    while sum(len(p) for p in paragraphs) < max(0, body_budget - 400):
        paragraphs.append(" ".join(_sentence(rng, rng.randint(8, 20)) for _ in range(5)))
    system = "\n\n".join([*paragraphs, *_closing(spec)])
    return AgentProfile(tools=tuple(tools), system_prompt=system)


def user_question(rng: random.Random) -> str:
    return "Please " + _sentence(rng, rng.randint(6, 14)).lower()


def history_turns(rng: random.Random, turns: int) -> tuple[dict[str, Any], ...]:
    """A multi-turn history: user questions and assistant answers, as later turns resend them."""
    out: list[dict[str, Any]] = []
    for _ in range(turns):
        out.append({"role": "user", "content": user_question(rng)})
        out.append({"role": "assistant", "content": _sentence(rng, rng.randint(10, 30))})
    return tuple(out)


# --- sizes, days and mixed workloads (benchmarks and the demo) -----------------------------------------

#: Tokens before the first user message that the benchmarks compare: a real client's 14K, and longer ones.
PREFIX_TOKENS = (14_000, 24_000, 32_000)


def chars_for_tokens(target_tokens: int, measure: Callable[[int], int], *, start_chars: int = 62_000,
                     rounds: int = 3, tolerance: float = 0.01) -> int:
    """The `prefix_chars` whose prefix measures `target_tokens` (within `tolerance`).

    `measure(prefix_chars)` returns the tokens a model's tokenizer and template give the prefix of
    `make_profile(WorkloadSpec(prefix_chars=...))`; characters per token depend on both, so sizes are
    calibrated against the server rather than assumed. The ratio is nearly constant, so a few secant
    steps suffice."""
    chars = start_chars
    for _ in range(max(1, rounds)):
        tokens = measure(chars)
        if tokens <= 0:
            raise ValueError(f"measure({chars}) returned {tokens} tokens")
        if abs(tokens - target_tokens) <= tolerance * target_tokens:
            break
        chars = max(1_000, round(chars * target_tokens / tokens))
    return chars


def next_day(spec: WorkloadSpec, days: int = 1) -> WorkloadSpec:
    """The same workspace `days` later: the prefix differs only at the `Conversation started:` line
    (and, in the `session_after_date` layout, at the session id on the line after it)."""
    return dataclasses.replace(spec, day=spec.day + dt.timedelta(days=days))


@dataclass(frozen=True)
class SessionPlan:
    """One agent session of a mixed workload: its prefix (spec) and the turns it sends, in order.

    Turn k resends the history of turns 0..k-1 (question and a canned answer) plus a new question, as
    agent clients do; `requests()` yields the bodies in that order."""

    spec: WorkloadSpec
    questions: tuple[str, ...]
    answers: tuple[str, ...]

    def requests(self, model: str, *, max_tokens: int = 8) -> list[dict[str, Any]]:
        profile = make_profile(self.spec)
        out: list[dict[str, Any]] = []
        history: list[dict[str, Any]] = []
        for question, answer in zip(self.questions, self.answers, strict=True):
            out.append(profile.request(model, question, history=tuple(history), max_tokens=max_tokens))
            history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return out


def mixed_workload(n_sessions: int = 50, *, prefix_chars: int = 12_000, workspaces: int = 3, days: int = 2,
                   max_turns: int = 2, seed: int = 11,
                   base: WorkloadSpec | None = None) -> list[SessionPlan]:
    """Sessions over several workspaces and days with 1..`max_turns` turns each, in a seeded shuffled
    order: what a fleet serving a team's agents sees. `workspaces * days` distinct prefixes."""
    rng = random.Random(seed)
    base = base or WorkloadSpec()
    specs = [
        dataclasses.replace(base, prefix_chars=prefix_chars, workspace=f"{base.workspace}-{w}",
                            day=base.day + dt.timedelta(days=d))
        for w in range(workspaces) for d in range(days)
    ]
    plans = []
    for i in range(n_sessions):
        turns = rng.randint(1, max_turns)
        plans.append(SessionPlan(
            # Each session its own: in the `session_after_date` layout no two share their id line.
            spec=dataclasses.replace(specs[i % len(specs)], session=i),
            questions=tuple(user_question(rng) for _ in range(turns)),
            answers=tuple(_sentence(rng, rng.randint(10, 30)) for _ in range(turns)),
        ))
    rng.shuffle(plans)
    return plans

"""The simulator's traffic: agent sessions over a Zipf mix of prefixes, the real client's and others.

A prefix is one agent client's tools and system prompt for one workspace and day. A share of them is
Hermes Agent's captured layout (`hermes_layout.py`: its 18 tools verbatim, the date three lines before
the head's end) for other workspaces and days; the rest come from the project's generator in three
sizes (8K, 24K and 60K characters). Sessions arrive as a Poisson process and pick their prefix by a
Zipf law (a few agents and workspaces carry most sessions); each has a geometric number of turns,
each turn resending the history with the previous answer and a new question after a think time.
Requests are the bodies the client would send, rendered by the gateway's own code (`chat_identity`).
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from llamafleet_testbed.hermes_layout import hermes_profile
from llamafleet_testbed.workload import AgentProfile, WorkloadSpec, make_profile, user_question

GENERATED_SIZES = (8_000, 24_000, 60_000)


@dataclass(frozen=True)
class TrafficSpec:
    sessions_per_hour: float = 100_000.0
    prefixes: int = 200  # distinct heads in the mix
    zipf_s: float = 1.1  # the Zipf exponent over them, most popular first
    real_client_share: float = 0.5  # of the prefixes: Hermes Agent's layout, other workspaces and days
    mean_turns: float = 3.0
    mean_think_s: float = 20.0  # between a turn's answer and the next turn
    answer_tokens: int = 64
    seed: int = 1


def zipf_cumulative(n: int, s: float) -> list[float]:
    """The cumulative weights of ranks 1..n under a Zipf law of exponent `s` (pure)."""
    return list(itertools.accumulate(1.0 / (rank ** s) for rank in range(1, n + 1)))


def real_ranks(n: int, share: float) -> frozenset[int]:
    """Which of ranks 0..n-1 are the real client's: `share` of them, spread evenly over the popularity
    order (pure), so the head of the Zipf law holds both kinds."""
    real = round(n * share)
    return frozenset(i for i in range(n) if (i * real) // n != ((i + 1) * real) // n)


def build_prefixes(spec: TrafficSpec) -> list[AgentProfile]:
    """The mix's prefixes, most popular first."""
    real, day0 = real_ranks(spec.prefixes, spec.real_client_share), dt.date(2026, 11, 2)
    out: list[AgentProfile] = []
    for i in range(spec.prefixes):
        if i in real:
            day = day0 + dt.timedelta(days=i % 7)
            spec_i = WorkloadSpec(workspace=f"/home/dev/projects/p{i}", day=day)
            out.append(hermes_profile(spec_i, model="sim"))
        else:
            size = GENERATED_SIZES[i % len(GENERATED_SIZES)]
            out.append(make_profile(WorkloadSpec(prefix_chars=size, seed=1000 + i, workspace=f"/srv/w{i}")))
    return out


@dataclass
class Session:
    """One conversation: its prefix, the turns left, and what it has said so far."""

    id: int
    prefix: int
    turns_left: int
    history: tuple[dict[str, Any], ...] = ()
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def request(self, profiles: list[AgentProfile], model: str, answer_tokens: int,
                ) -> tuple[dict[str, Any], str]:
        """This turn's body and its question."""
        question = user_question(self.rng)
        body = profiles[self.prefix].request(model, question, history=self.history, max_tokens=answer_tokens)
        return body, question

    def answered(self, question: str) -> None:
        words = ("done", "the", "file", "test", "passes", "now")
        answer = " ".join(self.rng.choice(words) for _ in range(12))
        self.history = (*self.history, {"role": "user", "content": question},
                        {"role": "assistant", "content": answer})
        self.turns_left -= 1


class Arrivals:
    """Sessions and their think times, from one seeded generator (the same spec: the same traffic)."""

    def __init__(self, spec: TrafficSpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._cumulative = zipf_cumulative(spec.prefixes, spec.zipf_s)
        self._ids = itertools.count()

    def next_gap_s(self) -> float:
        return self._rng.expovariate(self.spec.sessions_per_hour / 3600.0)

    def session(self) -> Session:
        point = self._rng.random() * self._cumulative[-1]
        prefix = bisect.bisect_left(self._cumulative, point)
        turns = 1
        while self._rng.random() > 1.0 / self.spec.mean_turns:  # geometric, mean `mean_turns`
            turns += 1
        sid = next(self._ids)
        return Session(sid, prefix, turns, rng=random.Random(self.spec.seed * 1_000_003 + sid))

    def think_s(self) -> float:
        return self._rng.expovariate(1.0 / self.spec.mean_think_s)

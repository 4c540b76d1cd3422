"""Single flights of first-sight builds, per head and per stage, and the prompt they are keyed by.

`Flights` makes a build single-flight inside one router replica: a request whose head is being
built by another request waits for that snapshot and restores it instead of computing the same tokens.
A flight is keyed by the tenant group too (`FlightKey`): with `key_tenants`, one group's request never
joins another group's build, which would share work across the isolation boundary and tell it, by
the wait, that the other group sent that head.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from llamafleet_core.types import UNKEYED, SnapshotRef, TextHasher
from llamafleet_router.snapshots.base import SnapshotConfig
from llamafleet_router.snapshots.cuts import stage_points

FlightKey = tuple[str, str, str]  # (model, tenant namespace, exact text hash of the prefix)


@dataclass(frozen=True, slots=True)
class Prompt:
    """What first sight needs of a request's identity. `hasher`: the identity's (its key, its tenant)."""

    model: str
    text: str
    blocks: tuple[str, ...]
    head_chars: int
    hasher: TextHasher = UNKEYED

    def text_hash(self, chars: int) -> str:
        """The exact identity of `text[:chars]`: what a snapshot of it is named and recorded by."""
        return self.hasher(self.text[:chars])

    def flight_key(self, chars: int) -> FlightKey:
        """The single flight building `text[:chars]`: one per model, tenant group and exact text."""
        return self.model, self.hasher.namespace, self.text_hash(chars)


class Flights:
    """In-process single flight keyed by `FlightKey` (`Prompt.flight_key`)."""

    def __init__(self) -> None:
        self._running: dict[FlightKey, asyncio.Future[SnapshotRef | None]] = {}

    def join(self, key: FlightKey) -> tuple[bool, asyncio.Future[SnapshotRef | None]]:
        """(True, future) for the new leader, who must call `finish`; (False, future) for a waiter."""
        running = self.running(key)
        if running is not None:
            return False, running
        future: asyncio.Future[SnapshotRef | None] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        return True, future

    def open(self, key: FlightKey) -> bool:
        """Start a flight for `key` unless one runs (True: the caller owns it and must `finish` it)."""
        return self.join(key)[0]

    def running(self, key: FlightKey) -> asyncio.Future[SnapshotRef | None] | None:
        """The flight building `key`, if one runs (without joining it)."""
        running = self._running.get(key)
        return running if running is not None and not running.done() else None

    def finish(self, key: FlightKey, result: SnapshotRef | None) -> None:
        future = self._running.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)

    def __len__(self) -> int:
        return len(self._running)


StageKeys = dict[int, FlightKey]  # stage cut (chars) -> its flight key


def prompt_stages(prompt: Prompt, config: SnapshotConfig) -> list[int]:
    """The stage points of a prompt's session prefix: one function for the build that saves them and
    for the requests that wait for them, so both name the same stages."""
    return stage_points(prompt.text, prompt.head_chars, min_chars=config.first_sight_min_chars,
                        min_gap=config.min_gap, limit=config.stages)


class StageFlights:
    """Single flight for the stages a session prefix shares with others.

    Two workspaces' first sessions, started together, share everything before their workspace blocks;
    keyed by exact session prefix only, each would compute that part. A leader opens a flight per stage
    it will save (keyed like a session prefix: model, tenant and text hash of the text up to the cut) and
    ends each as soon as that stage is saved; a request whose own prefix nobody builds waits for the
    latest of its stages in flight, restores it and builds only the rest."""

    def __init__(self, flights: Flights, config: SnapshotConfig) -> None:
        self._flights = flights
        self._config = config

    def keys(self, prompt: Prompt, after_chars: int) -> StageKeys:
        """Flight keys of the prompt's stage points past `after_chars` (the points the build uses)."""
        return {c: prompt.flight_key(c)
                for c in prompt_stages(prompt, self._config) if after_chars < c < prompt.head_chars}

    def open(self, prompt: Prompt, after_chars: int) -> StageKeys:
        """Open a flight for each stage past `after_chars` that nobody else is building."""
        return {c: k for c, k in self.keys(prompt, after_chars).items() if self._flights.open(k)}

    def saved(self, stages: StageKeys) -> Callable[[int, SnapshotRef], None]:
        """The build's `on_saved`: ends the stage's flight with its snapshot."""
        def on_saved(chars: int, ref: SnapshotRef) -> None:
            if chars in stages:
                self._flights.finish(stages[chars], ref)
        return on_saved

    def finish(self, stages: StageKeys) -> None:
        """End every stage flight still open (a no-op for the stages already saved)."""
        for key in stages.values():
            self._flights.finish(key, None)

"""Properties over random fleets, lookups and prompts (hypothesis)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llamafleet_core.types import Lookup, SlotRef
from llamafleet_router.scheduling.config import default_config
from llamafleet_router.scheduling.framework import (
    INDEX_AVAILABLE,
    LOOKUP,
    Candidate,
    CycleState,
    EndpointState,
    PluginHandle,
    SchedRequest,
    Scorer,
)
from llamafleet_router.scheduling.registry import register_builtin_plugins
from llamafleet_router.scheduling.scheduler import Scheduler

from .fakes import FakeIndex, FakeLeases, request, snapshot, state

NAMES = "abcdef"
CONFIG = default_config()


@st.composite
def fleets(draw: st.DrawFn) -> list[EndpointState]:
    out = []
    for name in NAMES[: draw(st.integers(1, len(NAMES)))]:
        n_slots = draw(st.integers(1, 6))
        busy = draw(st.frozensets(st.integers(0, n_slots - 1)))
        out.append(
            state(
                name,
                n_slots=n_slots,
                busy=tuple(busy),
                queue=draw(st.integers(0, 50)),
                in_flight=draw(st.integers(0, 50)),
                agent=draw(st.booleans()),
                attach=draw(st.booleans()),
                resume_anywhere=draw(st.booleans()),
                last_used=draw(st.dictionaries(st.integers(0, n_slots - 1), st.integers(0, 100))),
            )
        )
    return out


@st.composite
def lookups(draw: st.DrawFn) -> Lookup:
    # Block counts may exceed the prompt (a stale or buggy index): scores must still stay in [0, 1].
    slots = draw(
        st.dictionaries(
            st.builds(SlotRef, st.sampled_from([f"uid-{n}" for n in NAMES]), st.integers(0, 6)),
            st.integers(0, 80),
            max_size=10,
        )
    )
    snaps = draw(
        st.lists(
            st.builds(
                snapshot,
                st.text("xyz", min_size=1, max_size=3),
                st.sampled_from(NAMES),
                st.integers(0, 80),
                st.integers(0, 10**10),
            ),
            max_size=4,
        )
    )
    # The slot tags: some of the matching slots hold the prompt's head exactly, one its conversation.
    refs = sorted(slots, key=lambda ref: (ref.pod_uid, ref.slot))
    exact = draw(st.sets(st.sampled_from(refs))) if refs else set()
    conversation = draw(st.none() | st.sampled_from(refs)) if refs else None
    return Lookup(slots=slots, snapshots=tuple(snaps), conversation=conversation, exact_head=frozenset(exact))


def all_scorers() -> list[Scorer]:
    registry = register_builtin_plugins()
    out = []
    for spec in registry.values():
        if spec.kind == "scorer":
            plugin = spec.factory(spec.type_name, {}, PluginHandle())
            assert isinstance(plugin, Scorer)
            out.append(plugin)
    return out


SCORERS = all_scorers()


@settings(max_examples=150, deadline=None)
@given(
    fleet=fleets(),
    lookup=lookups(),
    n_blocks=st.integers(0, 60),
    session_blocks=st.integers(0, 60),
    available=st.booleans(),
    sid=st.none() | st.sampled_from(["s1", "s2"]),
)
def test_every_builtin_scorer_scores_every_candidate_within_unit_interval(
    fleet: list[EndpointState],
    lookup: Lookup,
    n_blocks: int,
    session_blocks: int,
    available: bool,
    sid: str | None,
) -> None:
    """Scores are in [0, 1] for each candidate, whatever the index says and however loaded the fleet."""
    req = request(n_blocks=n_blocks, session_blocks=session_blocks, session_id=sid)
    cs = CycleState()
    cs.write(LOOKUP, lookup)
    cs.write(INDEX_AVAILABLE, available)
    candidates = [Candidate(s, n) for s in fleet for n in range(s.endpoint.n_slots)]
    for scorer in SCORERS:
        scores = scorer.score(req, cs, candidates)
        assert set(scores) == {c.key for c in candidates}, scorer.type_name
        assert all(0.0 <= v <= 1.0 for v in scores.values()), (scorer.type_name, scores)


@settings(max_examples=100, deadline=None)
@given(fleet=fleets(), lookup=lookups(), down=st.booleans(), n_blocks=st.integers(0, 40))
def test_schedule_always_picks_an_idle_leased_slot_when_one_exists(
    fleet: list[EndpointState], lookup: Lookup, down: bool, n_blocks: int
) -> None:
    """With an idle slot anywhere, the decision is an idle slot of a live endpoint and holds its lease;
    with none, it is queued without a lease. Never raises for a healthy fleet serving the model."""
    leases = FakeLeases()
    sched = Scheduler(CONFIG, index=FakeIndex(lookup, down=down), leases=leases, holder_prefix="r")
    req: SchedRequest = request(n_blocks=n_blocks, session_blocks=n_blocks // 2)
    d = asyncio.run(sched.schedule(req, fleet))
    by_uid = {s.uid: s for s in fleet}
    assert 0 <= d.predicted_blocks <= n_blocks
    assert d.endpoint.pod.uid in by_uid
    if any(s.idle_slots for s in fleet):
        assert d.slot in by_uid[d.endpoint.pod.uid].idle_slots
        assert leases.held == {d.slot_ref: d.lease_holder}
    else:
        assert (d.branch, d.lease_holder) == ("queued", None)

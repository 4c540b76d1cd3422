"""The pure parts of the gateway's snapshot flow: cut points, names, exact-only restores, single flight."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

from pydantic import SecretStr

from llamafleet_core.prefix import PromptIdentity
from llamafleet_core.prefix.hashing import block_chain
from llamafleet_core.snapshot import Fingerprint, SnapshotManifest
from llamafleet_core.types import Action, Endpoint, Lookup, PodRef, SlotRef, SnapshotRef, exact_text_hash
from llamafleet_router.scheduling.action import choose_action
from llamafleet_router.scheduling.costs import ActionCosts
from llamafleet_router.settings import RouterSettings
from llamafleet_router.snapshots import SnapshotConfig
from llamafleet_router.snapshots.cuts import (
    TokenEnds,
    divergence_point,
    last_line_start,
    parse_name,
    ref_from_manifest,
    snapshot_name,
    stage_points,
)
from llamafleet_router.snapshots.flights import Flights
from llamafleet_router.snapshots.prime import PrimedSlots, same_text, slot_state
from llamafleet_router.snapshots.resync import keep_synced

BC = 256
SYSTEM = "<|im_start|>system\n" + "Tools and rules. " * 300 + "\n\nConversation started: Monday<|im_end|>\n"
PROMPT_TEXT = SYSTEM + "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def identity(text: str = PROMPT_TEXT, session: int = len(SYSTEM)) -> PromptIdentity:
    return PromptIdentity("m", text, block_chain(text, seed="m", block_chars=BC), BC, session, "template")


def pod(name: str, agent: bool = True) -> Endpoint:
    return Endpoint(PodRef(name, name, 0), f"http://{name}", "m", 4,
                    agent_url=f"http://{name}-agent" if agent else None)


def snap(name: str, pod_uid: str, text: str, chars: int, **kw: object) -> SnapshotRef:
    blocks = chars // BC
    fields: dict[str, object] = {"n_chars": chars, "text_hash": exact_text_hash(text[:chars]), **kw}
    return SnapshotRef(name, pod_uid, blocks, chars // 4, 4_000_000,
                       block_chain(text, seed="m", block_chars=BC)[blocks - 1], **fields)  # type: ignore[arg-type]


def test_stage_point_is_the_start_of_the_last_line_when_the_prefix_ends_in_a_special_token() -> None:
    """The date line's start is where a next-day session parts: it must be a stage point."""
    line = SYSTEM.index("Conversation")
    assert last_line_start(SYSTEM, len(SYSTEM)) == line
    assert stage_points(PROMPT_TEXT, len(SYSTEM), min_chars=2048, min_gap=512, limit=3) == [line]


def test_stage_points_include_the_paragraphs_before_the_date_line_where_workspaces_part() -> None:
    """An agent's system prompt ends in a workspace block and the date line: another workspace's first
    session parts at the block's start, so it is a stage point even a few tokens before the date line,
    and two workspaces' prompts share everything before it."""
    def system(folder: str) -> str:
        return ("<|im_start|>system\n" + "Tools and rules. " * 300
                + "\n\nBe brief and say when you are not sure.\n\n<workspace>\n"
                f"Working directory: {folder}\n</workspace>\n\nConversation started: Monday<|im_end|>\n")
    a, b = system("/home/a"), system("/home/bb")
    points = stage_points(a, len(a), min_chars=2048, min_gap=512, limit=4)
    workspace, line = a.index("<workspace>"), a.index("Conversation")
    assert points == [a.index("Be brief"), workspace, line]
    assert a[:workspace] == b[:workspace] and a[: workspace + 40] != b[: workspace + 40]
    assert stage_points(a, len(a), min_chars=2048, min_gap=512, limit=2) == [workspace, line]


def test_divergence_point_is_a_line_start_at_or_before_the_shared_prefix() -> None:
    text = "a" * 3000 + "\nsecond line\nthird"
    assert divergence_point(text, 3010, min_chars=2048) == 3001
    assert divergence_point(text, 3000, min_chars=2048) is None  # no safe cut at or before 3000
    assert divergence_point(text, 1000, min_chars=2048) is None


def test_token_cuts_are_exact_only_on_piece_boundaries_when_offsets_come_from_pieces() -> None:
    ends = TokenEnds.from_pieces("Hello world\nBye", ["Hello", " world", "\n", "Bye"])
    assert ends is not None and len(ends) == 4
    assert ends.tokens_at(12) == 3 and ends.tokens_at(13) is None and ends.tokens_at(15) == 4
    bos = TokenEnds.from_pieces("abc", ["<bos>", "abc"])  # a BOS the text lacks covers nothing
    assert bos is not None and bos.tokens_at(3) == 2 and bos.tokens_at(0) == 1
    assert TokenEnds.from_pieces("abc", ["ab", "d"]) is None  # pieces that do not spell the text
    assert TokenEnds.from_pieces("abc", ["ab", None]) is None


def test_byte_pieces_of_a_split_character_still_give_exact_cuts_around_it() -> None:
    """llama-server's `/tokenize` gives a token that is not valid UTF-8 alone as its byte values, as it
    did for this very text (an emoji split over three tokens, the first holding a space too). A real
    agent client's prompt holds such text; the cuts before and after it must still be found."""
    text = "a \u2014 b c \U0001f999 d\n\nX"
    pieces: list[object] = ["a", " \u2014", " b", " c", [32, 240, 159], [166], [153], " d", "\n\n", "X"]
    ends = TokenEnds.from_pieces(text, pieces)
    assert ends is not None
    assert ends.tokens_at(text.index("\n\n")) == 8  # after " d"
    assert ends.tokens_at(text.index("X")) == 9  # the line start after the emoji
    assert ends.tokens_at(text.index("\U0001f999")) is None  # inside the token " " + half the emoji
    assert ends.tokens_at(text.index(" d")) == 7  # the emoji's last byte ends exactly there
    assert ends.tokens_at(len(text)) == len(pieces)
    assert TokenEnds.from_pieces(text, [*pieces[:-1], [256]]) is None  # not a byte


def test_names_carry_the_exact_identity_so_listed_snapshots_can_be_recorded_again() -> None:
    h = exact_text_hash(SYSTEM)
    name = snapshot_name("fs", h, len(SYSTEM))
    ident = parse_name(name)
    assert ident is not None and (ident.kind, ident.text_hash, ident.n_chars) == ("fs", h, len(SYSTEM))
    assert parse_name("../../etc/passwd") is None and parse_name("shared-prefix") is None
    blocks = list(identity().blocks[: len(SYSTEM) // BC])
    manifest = SnapshotManifest(name=name, fingerprint=Fingerprint(model_sha256="x", build="b"), n_tokens=9,
                                tokens_sha256="t", blocks=blocks, block_chars=BC, size=10, sha256="s")
    ref = ref_from_manifest(manifest, "p", BC)
    assert ref is not None and ref.extended_by(PROMPT_TEXT) and ref.n_blocks == len(blocks)
    assert ref_from_manifest(manifest.model_copy(update={"block_chars": 128}), "p", BC) is None


def test_restore_only_proposes_snapshots_the_prompt_extends_strictly_when_text_is_known() -> None:
    """A longer snapshot whose tail differs, or one equal to the whole prompt, is never restored; the
    session-prefix snapshot beats a stage snapshot ending in the same block."""
    prompt = identity()
    other = PROMPT_TEXT.replace("Monday", "Friday")
    line = SYSTEM.index("Conversation")
    diverging = snap("fs-other", "a", other, len(SYSTEM))
    whole = snap("whole", "a", PROMPT_TEXT, len(PROMPT_TEXT) - len(PROMPT_TEXT) % BC)
    lookup = Lookup(snapshots=(diverging,))
    assert choose_action(prompt, pod("a"), 0, lookup, ActionCosts()).action is Action.COMPUTE
    stage, session = snap("st", "a", PROMPT_TEXT, line), snap("fs", "a", PROMPT_TEXT, len(SYSTEM))
    choice = choose_action(prompt, pod("a"), 0, Lookup(snapshots=(stage, session, diverging)), ActionCosts())
    assert choice.action is Action.RESTORE and choice.snapshot == session
    exact = identity(PROMPT_TEXT[: whole.n_chars], whole.n_chars)
    resend = choose_action(exact, pod("a"), 0, Lookup(snapshots=(whole,)), ActionCosts())
    assert resend.action is Action.COMPUTE


def test_restore_needs_an_agent_on_the_target_pod() -> None:
    session = snap("fs", "a", PROMPT_TEXT, len(SYSTEM))
    choice = choose_action(identity(), pod("a", agent=False), 0, Lookup(snapshots=(session,)), ActionCosts())
    assert choice.action is Action.COMPUTE


def test_a_local_snapshot_is_preferred_to_the_same_one_on_a_peer() -> None:
    local, remote = snap("fs", "a", PROMPT_TEXT, len(SYSTEM)), snap("fs", "b", PROMPT_TEXT, len(SYSTEM))
    choice = choose_action(identity(), pod("a"), 0, Lookup(snapshots=(remote, local)), ActionCosts())
    assert choice.snapshot == local


async def test_single_flight_has_one_leader_and_waiters_get_its_result() -> None:
    flights = Flights()
    leader, fut = flights.join(("m", "", "h"))
    second, same = flights.join(("m", "", "h"))
    assert leader and not second and fut is same
    ref = SnapshotRef("fs", "a", 1, 1, 1)
    flights.finish(("m", "", "h"), ref)
    assert await asyncio.wait_for(same, 1) == ref
    again, _ = flights.join(("m", "", "h"))
    assert again and len(flights) == 1


def test_the_agent_token_comes_from_settings_or_a_file_and_never_shows_in_repr(tmp_path: Path) -> None:
    assert SnapshotConfig.from_settings(RouterSettings()) is None  # no token: snapshots off
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    config = SnapshotConfig.from_settings(RouterSettings(agent_token_file=token_file))
    assert config is not None and config.token == "s3cret" and "s3cret" not in repr(config)
    assert "s3cret" not in repr(RouterSettings(agent_token=SecretStr("s3cret")))


def test_first_sight_builds_the_shared_head_not_a_conversations_own_prefix() -> None:
    """A later turn's session prefix holds its history, which no other session sends: first sight
    targets the shared head (tools and system prompt) instead, once for every session of the agent."""
    from llamafleet_router.scheduling.framework import SchedRequest
    from llamafleet_router.snapshots.preparation import head_prompt as _prompt

    history = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi there<|im_end|>\n"
    text = SYSTEM + history + "<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"
    later = PromptIdentity("m", text, block_chain(text, seed="m", block_chars=BC), BC, len(SYSTEM + history),
                           "template", len(SYSTEM))
    prompt = _prompt(SchedRequest(request_id="r", model="m", prompt=later))
    assert prompt is not None and prompt.head_chars == len(SYSTEM)
    first = _prompt(SchedRequest(request_id="r", model="m", prompt=identity()))
    assert first is not None and first.head_chars == len(SYSTEM)


def test_held_stage_is_the_longest_snapshot_of_the_prompt_within_the_window_and_the_slot() -> None:
    """A detached build starts from a snapshot the prompt extends, ending a short tail before the session
    end and not past what the request's slot holds; another text, a long tail or more than the slot
    holds never qualifies."""
    from llamafleet_router.snapshots.cuts import held_stage

    line = SYSTEM.index("Conversation")
    near = snap("near", "a", PROMPT_TEXT, line)
    far = snap("far", "a", PROMPT_TEXT, line - 2000)
    other = snap("other", "a", "x" * len(PROMPT_TEXT), line)
    session = len(SYSTEM)
    assert held_stage(PROMPT_TEXT, session, session, [far, near, other], window=1024) == near
    assert held_stage(PROMPT_TEXT, session, line - 1, [far, near], window=1024) is None  # slot holds less
    assert held_stage(PROMPT_TEXT, session, session, [far], window=1024) is None  # tail too long
    assert held_stage(PROMPT_TEXT, session, session, [other], window=1024) is None  # not this text


async def test_keep_synced_lists_pods_without_a_request_and_survives_a_failing_round() -> None:
    """`keep_synced` asks discovery for the pods every interval and hands them to the flow's Resync,
    once the flow exists; a round that fails (discovery raising) does not end the loop."""
    seen: list[list[str]] = []

    class FakeResync:
        async def ensure(self, pods: list[str]) -> None:
            seen.append(pods)

    rounds = 0

    async def endpoints() -> list[str]:
        nonlocal rounds
        rounds += 1
        if rounds == 2:
            raise RuntimeError("discovery hiccup")
        return ["pod-a"]

    flow: list[FakeResync] = []  # no flow yet: the first rounds have nothing to run
    task = asyncio.create_task(keep_synced(lambda: flow[0] if flow else None,  # type: ignore[arg-type,return-value]
                                           endpoints, 0.01))
    await asyncio.sleep(0.05)
    assert seen == [] and rounds == 0
    flow.append(FakeResync())
    for _ in range(100):
        if len(seen) >= 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert rounds >= 3 and seen[:2] == [["pod-a"], ["pod-a"]]


def test_a_slot_state_reads_tokens_and_last_task_and_is_none_for_a_missing_or_odd_entry() -> None:
    """GET /slots shows neither field until a slot's first task; a priming must compare them all the same."""
    slots = [{"id": 0, "n_ctx": 8192, "is_processing": False},
             {"id": 1, "n_prompt_tokens": 2664, "id_task": 7},
             {"id": 2, "n_prompt_tokens": "2664", "id_task": 7}]
    assert slot_state(slots, 0) == (None, None)
    assert slot_state(slots, 1) == (2664, 7)
    assert slot_state(slots, 2) is None  # not understood: the caller restores
    assert slot_state(slots, 3) is None


def test_a_primed_slot_is_taken_once_and_only_within_its_ttl() -> None:
    """A request pinned to a primed slot consumes the mark (the slot then holds that request); a mark
    older than the TTL is worth nothing (another replica may have used the slot)."""
    text = PROMPT_TEXT
    head = snap("fs-a", "p0", text, len(SYSTEM))
    copy = dataclasses.replace(head, name="fs-a", pod_uid="p1")
    other = snap("fs-b", "p0", "x" + text, len(SYSTEM))
    primed = PrimedSlots(ttl_s=60)
    primed.mark(SlotRef("p1", 2), copy, (None, None))
    assert same_text(head, copy) and not same_text(head, other)
    assert primed.holds(SlotRef("p1", 2), head) and not primed.holds(SlotRef("p1", 2), other)
    assert not primed.holds(SlotRef("p1", 1), head)
    entry = primed.take(SlotRef("p1", 2))
    assert entry is not None and entry.snapshot == copy and entry.state == (None, None)
    assert primed.take(SlotRef("p1", 2)) is None and primed.slots() == []
    stale = PrimedSlots(ttl_s=0)
    stale.mark(SlotRef("p1", 2), copy, (10, 3))
    assert not stale.holds(SlotRef("p1", 2), head) and stale.take(SlotRef("p1", 2)) is None


async def test_priming_gives_every_borrowed_slot_back_and_avoids_the_slots_it_primed() -> None:
    """One slot at a time: each is given back once loaded (or when its restore fails or raises), the
    next borrow avoids the slots already primed, a refused restore ends it (another slot would fare no
    better), and so does a pod without a spare idle slot."""
    from typing import Any, cast

    import httpx
    from prometheus_client import CollectorRegistry

    from llamafleet_core.index import InMemoryPrefixIndex
    from llamafleet_router.background import TaskSet
    from llamafleet_router.scheduling.framework import Decision, SchedRequest
    from llamafleet_router.snapshots.base import SnapshotMetrics
    from llamafleet_router.snapshots.prime import Primer
    from llamafleet_router.snapshots.restore import Restored, RestoreFailure

    target = pod("p0")
    head = snap("fs-a", "p0", PROMPT_TEXT, len(SYSTEM))
    ok = Restored(head, head.n_tokens, False, 0.01)
    refused = RestoreFailure("restore", "checksum", "bad")
    slots_json = [{"id": i, "n_ctx": 8192} for i in range(4)]
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=slots_json)))
    outcomes: list[object] = []
    borrowed: list[frozenset[int]] = []
    given_back: list[int] = []

    class FakeRestorer:
        async def restore(self, *args: object) -> Restored | RestoreFailure:
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return cast(Restored | RestoreFailure, outcome)

    class Lent:
        def __init__(self, slot: int) -> None:
            self.decision = Decision(target, slot, Action.COMPUTE, None, 0, "cold")

        def release(self, first: object = None) -> None:
            given_back.append(self.decision.slot)

    class Lender:
        async def lend(self, req: SchedRequest, *, pod_uid: str | None = None, min_idle: int = 1,
                       avoid: frozenset[int] = frozenset()) -> Lent | None:
            assert pod_uid == "p0" and min_idle == 2
            borrowed.append(avoid)
            choice = next((s for s in (1, 2, 3) if s not in avoid), None)
            return None if choice is None else Lent(choice)

    borrow = Lender()

    async def prime(run: list[object], count: int) -> list[int]:
        outcomes[:] = run
        borrowed.clear()
        given_back.clear()
        primer = Primer(http=http, index=InMemoryPrefixIndex(), restorer=cast(Any, FakeRestorer()),
                        metrics=SnapshotMetrics(CollectorRegistry()), tasks=TaskSet(), slots=PrimedSlots())
        await primer._prime(SchedRequest("r1", "m", identity()), head, "p0", {}, cast(Any, borrow), count)
        return sorted(ref.slot for ref in primer.slots.slots())

    assert await prime([ok, ok], 2) == [1, 2]
    assert borrowed == [frozenset(), frozenset({1})] and given_back == [1, 2]
    assert await prime([refused, ok], 2) == [] and borrowed == [frozenset()] and given_back == [1]
    assert await prime([RuntimeError("agent gone")], 2) == [] and given_back == [1]
    assert await prime([ok, ok, ok], 5) == [1, 2, 3] and given_back == [1, 2, 3]
    assert borrowed[-1] == frozenset({1, 2, 3})  # the 4th borrow found no slot left: priming ended

    # Priming waits until the request that built the prefix answers: no slot is borrowed before.
    outcomes[:] = [ok]
    borrowed.clear()
    answered = asyncio.Event()
    primer = Primer(http=http, index=InMemoryPrefixIndex(), restorer=cast(Any, FakeRestorer()),
                    metrics=SnapshotMetrics(CollectorRegistry()), tasks=TaskSet(), slots=PrimedSlots())
    waiting = asyncio.create_task(primer._prime(SchedRequest("r2", "m", identity()), head, "p0", {},
                                                cast(Any, borrow), 1, answered))
    for _ in range(20):  # let the task run as far as it can
        await asyncio.sleep(0)
    assert borrowed == [] and not waiting.done()
    answered.set()
    await waiting
    assert borrowed == [frozenset()] and [ref.slot for ref in primer.slots.slots()] == [1]
    await http.aclose()

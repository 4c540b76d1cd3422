"""Static discovery: what a pod serves, which slots are busy, down/up transitions and fencing."""

from __future__ import annotations

import asyncio

import httpx

from llamafleet_core.index.memory import InMemoryPrefixIndex
from llamafleet_core.types import Endpoint, PodRef, SlotRef, SnapshotRef
from llamafleet_router.discovery.base import PodProps, model_name
from llamafleet_router.discovery.pod_spec import PodSpec
from llamafleet_router.discovery.static import StaticDiscovery
from tests.router.fakes import FakeFleet, FakePod

URL = "http://pod-x:8080"


def test_model_name_is_alias_or_model_file_basename() -> None:
    assert model_name({"model_alias": "qwen", "model_path": "/m/q.gguf"}) == "qwen"
    assert model_name({"model_alias": "/m/q.gguf", "model_path": "/m/q.gguf"}) == "q.gguf"
    assert model_name({"model_path": "/models/tiny.gguf"}) == "tiny.gguf"
    props = PodProps.from_props(
        {"total_slots": 3, "model_alias": "a", "default_generation_settings": {"n_ctx": 9}}
    )
    assert (props.model, props.total_slots, props.n_ctx) == ("a", 3, 9)


async def test_pod_lifecycle_changes_epoch_and_fences_old_uid_when_it_comes_back() -> None:
    """Down on a connection error, and its entries are fenced (purged) at once; up again on /health 200
    in a new epoch, fenced again before it is visible. The uid stays the pod's URL, so that every
    router replica names it alike."""
    pod = FakePod(URL, model="m", n_slots=3, busy={1})
    fleet = FakeFleet(pod)
    fleet.agents_ready["http://agent-x:9000"] = True
    fenced: list[PodRef] = []

    async def fence(old: PodRef) -> None:
        fenced.append(old)

    async with fleet.client() as http:
        spec = PodSpec.parse(f"{URL}|http://agent-x:9000")
        disc = StaticDiscovery([spec], http, poll_interval=60, fence=fence)
        await disc.start()
        try:
            [status] = await disc.endpoints()
            assert status.ready and status.model == "m" and status.endpoint.n_slots == 3
            assert status.busy_slots == frozenset({1})
            assert status.endpoint.agent_url == "http://agent-x:9000"
            first_uid = status.endpoint.uid
            assert first_uid == URL

            pod.healthy = False
            await disc.poll_once()
            [down] = await disc.endpoints()
            await disc.poll_once()  # still down: no second purge
            await asyncio.sleep(0.01)
            assert not down.ready and [ref.uid for ref in fenced] == [first_uid]

            pod.healthy = True
            await disc.poll_once()
            [back] = await disc.endpoints()
            assert back.ready and back.endpoint.uid == first_uid
            assert back.endpoint.pod.epoch > status.endpoint.pod.epoch
            assert [ref.uid for ref in fenced] == [first_uid, first_uid]

            # a restart seen only through /slots (layout changed) is a new epoch too
            pod.n_ctx = 8192
            await disc.poll_once()
            [restarted] = await disc.endpoints()
            assert restarted.ready and restarted.endpoint.pod.epoch > back.endpoint.pod.epoch
            assert [ref.uid for ref in fenced] == [first_uid] * 3

            disc.mark_down(restarted.endpoint.uid)
            assert not (await disc.endpoints())[0].ready
        finally:
            await disc.stop()


async def _entries(index: InMemoryPrefixIndex) -> tuple[int, int]:
    """(slots, snapshots) the index holds for pod URL."""
    found = await index.lookup("m", BLOCKS)
    return sum(ref.pod_uid == URL for ref in found.slots), len(await index.snapshots("m", URL))


BLOCKS = ["b0", "b1", "b2"]


async def _record(index: InMemoryPrefixIndex) -> None:
    await index.record_slot("m", SlotRef(URL, 0), BLOCKS, 300)
    await index.record_snapshot("m", SnapshotRef("fs-x", URL, 3, 300, 1000, last_block="b2"), BLOCKS)


async def test_a_pod_that_goes_down_has_its_index_entries_purged_at_once() -> None:
    """A pod whose process is gone (the proxy's connection refused, or a failing poll) loses its slot
    and snapshot entries at once, not when it comes back (it may never): nothing routes by hints of a
    dead pod. When it returns they are purged again before it is visible, so entries written meanwhile
    (a request dispatched just before it died) go too."""
    pod = FakePod(URL, model="m", n_slots=2)
    fleet = FakeFleet(pod)
    index = InMemoryPrefixIndex()
    purges: list[asyncio.Event] = []

    async def fence(ref: PodRef) -> None:
        await index.purge_pod(ref.uid)
        purges[-1].set()

    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec.parse(URL)], http, poll_interval=60, fence=fence)
        await disc.start()
        try:
            # the proxy could not connect: marked down, purged without waiting for the next poll
            await _record(index)
            purges.append(asyncio.Event())
            disc.mark_down(URL)
            await asyncio.wait_for(purges[-1].wait(), 1.0)
            assert await _entries(index) == (0, 0)

            # written after the purge (dispatched just before the pod died): gone once it is back
            await _record(index)
            purges.append(asyncio.Event())
            await disc.poll_once()
            assert (await disc.endpoints())[0].ready and purges[-1].is_set()
            assert await _entries(index) == (0, 0)

            # the process is gone between two polls: the poll marks it down and purges it
            await _record(index)
            pod.healthy = False
            purges.append(asyncio.Event())
            await disc.poll_once()
            await asyncio.wait_for(purges[-1].wait(), 1.0)
            assert not (await disc.endpoints())[0].ready and await _entries(index) == (0, 0)
        finally:
            await disc.stop()


async def test_stop_ends_a_watcher_cancelled_just_as_its_pod_answered() -> None:
    """`stop()` cancels the pod's watcher in the very step its `/slots` call returned. On Python 3.11
    `asyncio.wait_for` swallowed such a cancel: the watcher polled on, `stop()` waited for it forever,
    and (in CI) it purged the pod's entries after the app had ended."""
    fleet = FakeFleet(FakePod(URL, model="m", n_slots=2))
    answered = asyncio.Event()
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec.parse(URL)], http, poll_interval=0.001)
        client = disc._pods[0].client  # the watcher's own client: its answer is the moment to cancel at
        slots, calls = client.slots, 0

        async def answering_slots():  # type: ignore[no-untyped-def]
            nonlocal calls
            answer = await slots()
            calls += 1
            if calls == 2:  # a later poll, not the one `start()` waits for
                answered.set()  # and return in the same step: the cancel comes before the watcher resumes
            return answer

        client.slots = answering_slots  # type: ignore[method-assign]
        await disc.start()
        await answered.wait()
        async with asyncio.timeout(5.0):
            await disc.stop()
    assert calls == 2  # nothing polled after the stop


async def test_pod_never_reached_has_no_props_and_is_not_ready() -> None:
    pod = FakePod(URL, healthy=False)
    async with FakeFleet(pod).client() as http:
        disc = StaticDiscovery([PodSpec.parse(URL)], http, poll_interval=60)
        await disc.start()
        [status] = await disc.endpoints()
        await disc.stop()
    assert not status.ready and status.props is None


async def test_pod_with_an_agent_is_routable_only_when_its_agent_is_ready() -> None:
    """A (re)started pod whose agent does not hold its required snapshots yet (`/ready` 503) stays
    DOWN: it must not get traffic before it is warm."""
    pod = FakePod(URL, model="m", n_slots=2)
    fleet = FakeFleet(pod)
    fleet.agents_ready["http://agent-x:9000"] = False
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec.parse(f"{URL}|http://agent-x:9000")], http, poll_interval=60)
        await disc.poll_once()
        [cold] = await disc.endpoints()
        fleet.agents_ready["http://agent-x:9000"] = True
        await disc.poll_once()
        [warm] = await disc.endpoints()
    assert not cold.ready and warm.ready


async def test_pod_is_marked_down_when_it_hangs() -> None:
    """A pod that stops answering `/slots` (SIGSTOP, a stuck GPU) goes DOWN within the hang bound."""
    pod = FakePod(URL, model="m", n_slots=2)
    fleet = FakeFleet(pod)
    release = asyncio.Event()

    async def hanging(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots" and pod_hangs:
            await release.wait()
        return fleet.handler(request)

    pod_hangs = False
    async with httpx.AsyncClient(transport=httpx.MockTransport(hanging)) as http:
        disc = StaticDiscovery([PodSpec.parse(URL)], http, poll_interval=0.1)
        await disc.poll_once()
        [before] = await disc.endpoints()
        pod_hangs = True
        started = asyncio.get_running_loop().time()
        await disc.poll_once()
        waited = asyncio.get_running_loop().time() - started
        [during] = await disc.endpoints()
        release.set()
    assert before.ready and not during.ready and waited < 4.0


def test_hang_bound_is_a_setting_for_slow_hardware() -> None:
    """Where one batch takes seconds, the hang bound must be raised above it; unset, it follows the
    poll interval."""
    http = httpx.AsyncClient()
    assert StaticDiscovery([], http, poll_interval=0.5)._hang_after == 3.0
    assert StaticDiscovery([], http, poll_interval=2.0)._hang_after == 8.0
    assert StaticDiscovery([], http, poll_interval=0.5, hang_timeout=30.0)._hang_after == 30.0


async def _what_agents_say(body: dict[str, object], *specs: str) -> dict[str, Endpoint]:
    """The endpoints of `specs` (`url` or `url|agent`) once discovered, where agent-x's `/ready`
    answers `body` and agent-z's an older agent's (no fields)."""
    fleet = FakeFleet(*(FakePod(spec.split("|")[0], model="m") for spec in specs))
    for agent in ("http://agent-x:9000", "http://agent-z:9000"):
        fleet.agents_ready[agent] = True
    fleet.agents_body["http://agent-x:9000"] = body
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec.parse(spec) for spec in specs], http, poll_interval=60)
        await disc.start()
        try:
            return {s.endpoint.url: s.endpoint for s in await disc.endpoints()}
        finally:
            await disc.stop()


async def test_pod_resumes_only_at_checkpoints_when_its_agent_says_so() -> None:
    """The agent reads the model file (gguf_meta.py) and says how slots resume; a pod whose agent does
    not say (an older agent) or that has none keeps the attention-only default."""
    got = await _what_agents_say({"ready": True, "resume": "checkpoints"}, f"{URL}|http://agent-x:9000",
                                 "http://pod-y:8080", "http://pod-z:8080|http://agent-z:9000")
    assert {url: e.resume_anywhere for url, e in got.items()} == {
        URL: False, "http://pod-y:8080": True, "http://pod-z:8080": True}


async def test_pod_gets_no_restores_when_its_agent_found_them_unused() -> None:
    """The agent's restore probe (agent/restore_check.py) found that the server does not resume from a
    restored slot: the endpoint says so; an older agent's body, or none, keeps restores on."""
    got = await _what_agents_say({"ready": True, "resume": "checkpoints", "restores": "unusable"},
                                 f"{URL}|http://agent-x:9000", "http://pod-z:8080|http://agent-z:9000")
    assert {url: e.restores for url, e in got.items()} == {URL: False, "http://pod-z:8080": True}


async def test_a_pods_status_is_kept_until_what_it_says_changes() -> None:
    """The router keeps a pod's scheduling view while its status is the same object (fleet/state.py):
    a poll that finds nothing new keeps it; new busy slots, a pod down or back in a new epoch, or new
    settings give a new one that says so, and leave the other pods' alone."""
    pod, other = FakePod(URL, model="m", n_slots=3, busy={1}), FakePod("http://pod-y:8080", model="m")
    fleet = FakeFleet(pod, other)
    async with fleet.client() as http:
        disc = StaticDiscovery([PodSpec.parse(URL), PodSpec.parse(other.url)], http, poll_interval=60)
        await disc.start()
        try:
            first = await disc.endpoints()
            await disc.poll_once()
            again = await disc.endpoints()
            assert again[0] is first[0] and again[1] is first[1]
            pod.busy = {0, 2}
            await disc.poll_once()
            busy, same = await disc.endpoints()
            assert busy is not first[0] and busy.busy_slots == {0, 2} and same is first[1]
            pod.healthy = False
            await disc.poll_once()
            down, same = await disc.endpoints()
            assert not down.ready and same is first[1]
            pod.healthy = True
            await disc.poll_once()
            back, _ = await disc.endpoints()
            assert back.ready and back.endpoint.pod.epoch > first[0].endpoint.pod.epoch
            disc.update(PodSpec.parse(f"{URL}|http://agent-x:9000"))
            moved, _ = await disc.endpoints()
            assert moved is not back and moved.endpoint.agent_url == "http://agent-x:9000"
        finally:
            await disc.stop()

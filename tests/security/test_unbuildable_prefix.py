"""Finding 1: a SharedPrefix that no pod can build fails alone, never takes the fleet out of rotation.

Before the fix, a prefix that could not be seeded anywhere (longer than a slot's context, or no idle
slot at that moment) still came back with a snapshot name, its hash went into the status, every agent
was told to require it, every pod's `/ready` stayed 503, and nothing tried again until the spec changed.

Now: the warm result has no snapshot; the operator writes the failure into the prefix's own status
(with the reason and when it tries again), requires of pods only snapshots some running pod holds, and
retries with backoff. Real llama-server and real agents throughout, plus the pure rules beside them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from llamafleet_agent import AgentSettings, create_app
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.warming import PrefixSource, WarmError, WarmPod, warm_shared_prefix
from llamafleet_operator.reconcile.readiness import FleetPrefix, required_set
from llamafleet_operator.reconcile.retry import Backoff, backoff_for
from llamafleet_operator.settings import OperatorSettings
from tests.agent.conftest import SERVER_ARGS, serve_over_socket
from tests.operator.kubelet import operated_node, tiny_dense_fleet
from tests.operator.operator_bed import (
    FLEETS,
    NS,
    PREFIXES,
    create,
    emulated_api,
    eventually,
    obj,
    patch_spec,
)

TOKEN = "unbuildable-prefix-token"
CONTEXT = 512
LONG_TEXT = "Every pod of the fleet answers in the same careful way, one short sentence at a time. " * 120
SHORT_TEXT = "You are the fleet's careful assistant. Answer briefly and exactly. " * 4


# --- pure rules -------------------------------------------------------------------------------------

def test_a_prefix_no_running_pod_holds_is_required_of_nobody() -> None:
    """Required only where there is a peer to pull it from: a snapshot name alone (a failed seed that
    still wrote a hash), or one held only by pods that are gone, gates no pod."""
    never_built = FleetPrefix("a", "sp-a-000000000000", frozenset(), False)
    holders_gone = FleetPrefix("b", "sp-b-000000000000", frozenset({"old-0"}), False)
    held = FleetPrefix("c", "sp-c-000000000000", frozenset({"pod-0"}), False)
    running = ["pod-0", "pod-1"]
    assert required_set([never_built, holders_gone], running) == []
    assert required_set([never_built, holders_gone, held], running) == ["sp-c-000000000000"]


def test_backoff_doubles_up_to_its_cap_and_restarts_with_a_new_generation() -> None:
    table: dict[str, Backoff] = {}
    b = backoff_for(table, "uid", 1, initial_s=10, max_s=60)
    assert b.due(0.0)
    delays = [b.failed(100.0 * i) for i in range(5)]
    assert delays == [10, 20, 40, 60, 60]
    assert not b.due(400.0 + 59) and b.due(400.0 + 60)
    assert "attempt 5" in b.note(60)
    assert backoff_for(table, "uid", 1, initial_s=10, max_s=60) is b  # same generation: same record
    fresh = backoff_for(table, "uid", 2, initial_s=10, max_s=60)
    assert fresh is not b and fresh.attempts == 0 and fresh.due(0.0)
    b.succeeded()
    assert b.attempts == 0 and b.due(0.0)


def test_retry_delays_are_operator_settings() -> None:
    s = OperatorSettings()
    assert (s.prefix_retry_initial_s, s.prefix_retry_max_s) == (10.0, 600.0)


# --- the warming library against a real pod ----------------------------------------------------------

@contextlib.asynccontextmanager
async def small_pod(start_llama_server: Any, model: Path, tmp_path: Path) -> AsyncIterator[WarmPod]:
    """One llama-server with a single 512-token slot, and its agent on a real socket."""
    snapdir = tmp_path / "snapshots"
    snapdir.mkdir()
    server = start_llama_server(model, slots=1, ctx=CONTEXT, slot_save_path=snapdir, extra_args=SERVER_ARGS)
    async with httpx.AsyncClient(timeout=60.0) as http:
        settings = AgentSettings(llama_url=server.url, snapshot_dir=snapdir, model_file=model, slots=1,
                                 flash_attn="on", pod_name="pod-0", model_name="tiny")
        app = create_app(settings, llama=LlamaClient(server.url, http), http=http,
                         registry=CollectorRegistry(), token=TOKEN)
        async with serve_over_socket(app) as agent_url:
            yield WarmPod("pod-0", "uid-0", server.url, agent_url)


@pytest.mark.llama
async def test_a_prefix_longer_than_the_context_has_no_snapshot_and_names_the_reason(
        start_llama_server: Any, tiny_models: Any, tmp_path: Path) -> None:
    """llama-server refuses the prefill: the result carries no snapshot name (nothing to record or
    require); with the slot size known, the operator's warm refuses it up front as PrefixTooLong."""
    source = PrefixSource(name="huge", model="tiny", text=LONG_TEXT)
    async with small_pod(start_llama_server, tiny_models.dense, tmp_path) as pod, \
            httpx.AsyncClient(timeout=60.0) as http:
        result = await warm_shared_prefix(source, [pod], http=http, agent_token=TOKEN, index=None)
        assert result.snapshot == "", "a prefix seeded nowhere must not come back with a snapshot name"
        assert [s.state for s in result.pods] == ["failed"]
        assert "seeding failed" in result.pods[0].message

        with pytest.raises(WarmError) as caught:
            await warm_shared_prefix(source, [pod], http=http, agent_token=TOKEN, index=None,
                                     max_tokens=CONTEXT)
        assert caught.value.reason == "PrefixTooLong" and f"a slot holds {CONTEXT}" in str(caught.value)

        short = PrefixSource(name="short", model="tiny", text=SHORT_TEXT)
        ok = await warm_shared_prefix(short, [pod], http=http, agent_token=TOKEN, index=None,
                                      max_tokens=CONTEXT)
        assert ok.snapshot.startswith("sp-short-") and [s.state for s in ok.pods] == ["warm"]


# --- the operator, end to end ------------------------------------------------------------------------

def _status(api: Any, resource: Any, name: str) -> dict[str, Any]:
    return dict((obj(api, resource, name) or {}).get("status") or {})


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _failed_again(api: Any) -> dict[str, Any] | None:
    """The prefix's status once it failed as too long at least twice (so it is being retried)."""
    st = _status(api, PREFIXES, "huge")
    degraded = _conditions(st).get("Degraded") or {}
    retried = degraded.get("reason") == "PrefixTooLong" and "attempt 1;" not in degraded.get("message", "")
    return st if st.get("phase") == "Failed" and retried and "attempt" in degraded["message"] else None


@pytest.mark.llama
@pytest.mark.slow
async def test_an_unbuildable_prefix_fails_alone_while_the_fleet_keeps_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama_server_bin: Path, tiny_models: Any) -> None:
    """A SharedPrefix longer than the fleet's context: its status says PrefixTooLong and is retried; the
    pod is told to require nothing and stays Ready the whole time. Shortened, it warms and is required."""
    async with emulated_api(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        settings = OperatorSettings(
            kubeconfig=kubeconfig, namespaces=[NS], agent_token=TOKEN, reconcile_interval_s=0.3,
            prefix_interval_s=0.2, prefix_retry_initial_s=0.2, prefix_retry_max_s=0.5,
            allowed_host_paths=[str(tiny_models.dense.parent)])
        async with operated_node(api, settings, binary=llama_server_bin, model=tiny_models.dense,
                                 workdir=tmp_path / "node", token=TOKEN) as node:
            await create(api, tiny_dense_fleet(tiny_models.dense, slots=1, contextPerSlot=CONTEXT))
            await eventually(lambda: _status(api, FLEETS, "tiny").get("ready") == "1/1", 60, "pod Ready")

            await create(api, {"apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix",
                               "metadata": {"name": "huge", "namespace": NS},
                               "spec": {"fleetRef": {"name": "tiny"}, "text": LONG_TEXT}})
            st = await eventually(lambda: _failed_again(api), 30, "the prefix failing, and retried")
            assert "hash" not in st, "a prefix built nowhere must not record a snapshot"
            assert f"a slot holds {CONTEXT}" in _conditions(st)["Degraded"]["message"]
            assert _conditions(st)["Ready"]["status"] == "False"

            pod = node.pods["tiny-0"]
            required = await pod.agent.required()
            assert required.declared and required.required == [], "the pod must not wait for it"
            assert pod.ready and (await pod.agent.readiness())["ready"] is True
            assert _status(api, FLEETS, "tiny")["ready"] == "1/1"

            await patch_spec(api, "sharedprefixes", "huge", {"text": SHORT_TEXT})
            st = await eventually(lambda: (s := _status(api, PREFIXES, "huge")).get("phase") == "Warm" and s,
                                  30, "the shortened prefix warm")
            snapshot = f"sp-huge-{st['hash'][:12]}"

            async def required_now() -> list[str] | None:
                names = (await pod.agent.required()).required
                return names or None

            assert await eventually(required_now, 20, "the warm prefix required") == [snapshot]
            await eventually(lambda: _status(api, FLEETS, "tiny").get("ready") == "1/1", 20, "still Ready")
            assert not node.errors

"""Snapshot faults: an agent killed while a peer pulls from it, and damaged or mismatched snapshots.

Both run through the real gateway (restore-on-miss) and the real agents of `up`. A snapshot is "used"
when the gateway's answer names it (`x-llamafleet-snapshot`); a damaged one must never be.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.types import SlotRef
from llamafleet_local.reliability.bed import PREFIX, Bed, kill, until
from llamafleet_local.reliability.client import QUESTIONS, chat_body, send
from llamafleet_local.reliability.outcome import SUCCEEDED, ScenarioResult

OTHER_REPLICA = "reliability-other-replica"  # holds a pod's slots, as another gateway replica would
SESSION = " ".join(f"Project note {i}: the service reads its settings from disk and retries twice."
                   for i in range(130))  # ~10K characters: a session prefix worth pulling, not computing
DAMAGES = ("corrupt", "truncate", "other_model", "other_kv")


def damage(folder: Path, name: str, how: str) -> None:
    """Break snapshot `name` in `folder`: flip bytes, cut the file, or make its manifest claim another
    model digest or another KV cache type."""
    binary, manifest_path = folder / f"{name}.bin", folder / f"{name}.json"
    if how == "corrupt":
        data = bytearray(binary.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        binary.write_bytes(bytes(data))
    elif how == "truncate":
        binary.write_bytes(binary.read_bytes()[: binary.stat().st_size // 2])
    elif how in ("other_model", "other_kv"):
        manifest = json.loads(manifest_path.read_text())
        key, value = ("model_sha256", "0" * 64) if how == "other_model" else ("cache_type_k", "q8_0")
        manifest["fingerprint"][key] = value
        manifest_path.write_text(json.dumps(manifest))
    else:
        raise ValueError(f"unknown damage {how!r}")


def _requests_on_port(port: int) -> int:
    """Accepted connections to `port` with unread request bytes (a frozen server's pending requests)."""
    waiting = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            rx_queue = int(fields[4].split(":")[1], 16)
            if local_port == port and fields[3] == "01" and rx_queue > 0:
                waiting += 1
    return waiting


def _source(folder: Path, name: str) -> str | None:
    try:
        return str(json.loads((folder / f"{name}.json").read_text()).get("source_pod"))
    except (OSError, ValueError):
        return None


async def _hold(bed: Bed, pod: int, take: bool) -> None:
    assert bed.fleet.index is not None
    leases = bed.fleet.index.leases
    for slot in range(2):
        ref = SlotRef(bed.pod(pod).layout.llama_url, slot)
        if take:
            await leases.acquire(ref, OTHER_REPLICA, 60.0)
        else:
            await leases.release(ref, OTHER_REPLICA)


async def kill_agent(bed: Bed, rounds: int = 2) -> ScenarioResult:
    """A session prefix snapshotted on pod X (first sight); X's slots held by another replica, so the
    next session goes to pod Y, whose agent pulls the snapshot from X's agent: X's agent is frozen,
    the pull's request reaches it, and it is SIGKILLed. The answer must come without the snapshot."""
    r = ScenarioResult("kill -9 agent mid-transfer", "SIGKILL the agent a peer is pulling a snapshot from")
    started = time.monotonic()
    assert bed.fleet.index is not None
    index = bed.fleet.index.index
    cut = used = 0
    results = []
    for k in range(rounds):
        system = f"Session {k}. {SESSION}"
        first = await send(bed.http, [bed.url], chat_body(bed.model, system, QUESTIONS[0], stream=False,
                                                          max_tokens=4), n=2 * k)
        results.append(first)
        x = next((i for i, p in enumerate(bed.fleet.pods) if p.layout.llama_url == first.pod), 0)
        y, source = 1 - x, bed.pod(x)

        async def saved(uid: str = source.layout.llama_url) -> bool:
            return any(s.name.startswith("fs-") for s in await index.snapshots(bed.model, uid))

        await until(saved, 10.0)
        names = {s.name for s in await index.snapshots(bed.model, source.layout.llama_url)}
        await _hold(bed, x, True)
        kill(source.agent.pid, signal.SIGSTOP)
        try:
            body = chat_body(bed.model, system, QUESTIONS[1], stream=True, max_tokens=8)
            pending = asyncio.create_task(send(bed.http, [bed.url], body, n=2 * k + 1, timeout=60.0))

            async def pulling(port: int = source.layout.agent_port) -> bool:
                return _requests_on_port(port) > 0

            hit = await until(pulling, 10.0, every=0.002)
            kill(source.agent.pid, signal.SIGKILL)
        finally:
            kill(source.agent.pid, signal.SIGCONT)
        answer = await pending
        results.append(answer)
        await _hold(bed, x, False)
        cut += hit is not None
        used += answer.snapshot in names and answer.pod == bed.pod(y).layout.llama_url
        # Y may hold the prefix now only as its own computation (first sight saved it there), never as
        # a copy of X's file: the manifest says where a snapshot's bytes came from.
        pulled = [n for n in names if n.startswith("fs-")
                  and _source(bed.pod(y).layout.snapshot_dir, n) not in (None, bed.pod(y).name)]
        r.expect(not pulled, f"round {k}: pod {y} kept {pulled} from the killed transfer")

        async def back(i: int = x) -> bool:
            return bed.fleet.pods[i].ready and await bed.pod_ready(i)

        await asyncio.sleep(1.0)  # supervise notices the dead agent within its poll interval
        await until(back, 60.0, every=0.1)
    r.add(results)
    r.finish()
    r.wrongly_restored = used
    r.seconds = time.monotonic() - started
    r.checks.update({"transfers_cut": cut, "restarts": bed.fleet.progress.restarts,
                     "actions": [s.action for s in results[1::2]]})
    r.expect(r.other_failed == 0 and r.lost == 0, f"{r.other_failed} failed and {r.lost} lost")
    r.expect(cut == rounds, f"only {cut} of {rounds} rounds caught a pull in flight")
    r.expect(used == 0, f"{used} answers used a snapshot whose transfer was cut")
    return r


async def bad_snapshots(bed: Bed) -> ScenarioResult:
    """The SharedPrefix snapshot on pod 0 damaged four ways: the agent refuses each restore asked
    directly, and the gateway (pod 1's slots held elsewhere) answers every request without it."""
    r = ScenarioResult("bad snapshots", "corrupt, truncated, other model digest, other KV type")
    started = time.monotonic()
    assert bed.fleet.index is not None
    index = bed.fleet.index.index
    pod = bed.pod(0)
    uid, folder = pod.layout.llama_url, pod.layout.snapshot_dir
    name = bed.fleet.results[PREFIX].snapshot
    good = next(s for s in await index.snapshots(bed.model, uid) if s.name == name)
    blocks = json.loads((folder / f"{name}.json").read_text())["blocks"]
    backup = {p: p.read_bytes() for p in (folder / f"{name}.bin", folder / f"{name}.json")}
    agent = AgentClient(pod.layout.agent_url, bed.http, bed.fleet.agent_token)
    llama = LlamaClient(uid, bed.http)
    refused: dict[str, str] = {}
    accepted, results = 0, []
    await _hold(bed, 1, True)
    try:
        for n, how in enumerate(DAMAGES):
            damage(folder, name, how)
            try:
                await agent.restore(name, 0)
                accepted += 1
            except AgentError as exc:
                refused[how] = exc.kind or str(exc.status)
            for slot in range(2):
                await llama.erase_slot(slot)
                await index.forget_slot(bed.model, SlotRef(uid, slot))
            await index.record_snapshot(bed.model, good, blocks)
            answer = await send(bed.http, [bed.url], bed.body(n, stream=n % 2 == 0, max_tokens=8), n=n)
            results.append(answer)
            accepted += answer.snapshot == name and answer.verdict == SUCCEEDED
            for path, data in backup.items():
                path.write_bytes(data)
    finally:
        for path, data in backup.items():
            path.write_bytes(data)
        await _hold(bed, 1, False)
    r.add(results)
    r.finish()
    r.wrongly_restored = accepted
    r.seconds = time.monotonic() - started
    r.checks.update({"refused_by_agent": refused, "actions": [s.action for s in results]})
    r.expect(len(refused) == len(DAMAGES), f"the agent restored {sorted(set(DAMAGES) - set(refused))}")
    r.expect(accepted == 0, f"{accepted} damaged snapshots were restored")
    r.expect(r.other_failed == 0 and r.lost == 0, f"{r.other_failed} failed and {r.lost} lost")
    return r

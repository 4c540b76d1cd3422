"""Snapshot faults: an agent killed while a peer pulls from it, and damaged or mismatched snapshots.

Both run through the real gateway (restore-on-miss) and the real agents of `up`. A snapshot is "used"
when the gateway's answer names it (`x-llamafleet-snapshot`); a damaged one must never be.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from llamafleet_core.agent_client import AgentClient, AgentError
from llamafleet_core.llama_client import LlamaClient
from llamafleet_core.snapshot import SnapshotManifest
from llamafleet_core.snapshot_signing import manifest_key, sign_manifest
from llamafleet_core.types import SlotRef
from llamafleet_testbed.reliability.bed import PREFIX, Bed, kill, until
from llamafleet_testbed.reliability.client import QUESTIONS, chat_body, send
from llamafleet_testbed.reliability.link import SlowLink
from llamafleet_testbed.reliability.outcome import SUCCEEDED, ScenarioResult, Sent, agreement

KILL_AFTER_BYTES = 64 * 1024  # of the snapshot file relayed to the puller when its source is killed
OTHER_REPLICA = "reliability-other-replica"  # holds a pod's slots, as another gateway replica would
SESSION = " ".join(f"Project note {i}: the service reads its settings from disk and retries twice."
                   for i in range(130))  # ~10K characters: a session prefix worth pulling, not computing
DAMAGES = ("corrupt", "truncate", "other_model", "other_kv")


def damage(folder: Path, name: str, how: str, key: bytes) -> None:
    """Break snapshot `name` in `folder`: flip bytes, cut the file, or make its manifest claim another
    model digest or another KV cache type. The manifest is signed again with the agents' `key`: the
    case is a snapshot that does not fit (a pod restarted with other settings on the same volume),
    not one that no agent wrote (refused for its signature: tests/security/test_agent_trust_real.py)."""
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
        field, value = ("model_sha256", "0" * 64) if how == "other_model" else ("cache_type_k", "q8_0")
        manifest["fingerprint"][field] = value
        edited = sign_manifest(SnapshotManifest.model_validate(manifest), key)
        manifest_path.write_text(edited.model_dump_json())
    else:
        raise ValueError(f"unknown damage {how!r}")


def _not_own(folder: Path, names: set[str], own: str) -> list[str]:
    """Snapshots of `names` visible in `folder` under their real name that are not the pod's own
    complete file: a copy from another pod, a file without its manifest, or one of another size than
    its manifest says (a partial transfer renamed too early)."""
    found = []
    for name in sorted(names):
        binary = folder / f"{name}.bin"
        if not binary.exists():
            continue
        try:
            manifest = json.loads((folder / f"{name}.json").read_text())
        except (OSError, ValueError):
            found.append(name)
            continue
        if manifest.get("source_pod") != own or manifest.get("size") != binary.stat().st_size:
            found.append(name)
    return found


def _size(folder: Path, name: str) -> int:
    return int(json.loads((folder / f"{name}.json").read_text())["size"])


async def _hold(bed: Bed, pod: int, take: bool) -> None:
    """Take (or give back) every slot lease of the pod as another replica would. A slot the gateway
    still holds (the last request's lease until its index record is written, a slot lent to priming
    after that request answered) is waited for: a hold that silently missed one let the next session
    land on the pod it was meant to avoid."""
    assert bed.fleet.index is not None
    leases = bed.fleet.index.leases
    for slot in range(2):
        ref = SlotRef(bed.pod(pod).layout.llama_url, slot)
        if not take:
            await leases.release(ref, OTHER_REPLICA)
            continue

        async def held(ref: SlotRef = ref) -> bool:
            return await leases.acquire(ref, OTHER_REPLICA, 60.0)

        if await until(held, 30.0, every=0.01) is None:
            raise RuntimeError(f"could not hold {ref.key()}: the gateway never gave its lease back")


def _pull_failures(bed: Bed) -> float:
    """Pulls the gateway saw fail on a request's path (restore-on-miss), whatever the reason."""
    return bed.sample("llamafleet_router_snapshot_failures_total", op="pull")


async def kill_agent(bed: Bed, rounds: int = 2) -> ScenarioResult:
    """A session prefix snapshotted on pod X (first sight); X's slots held by another replica, so the
    next session of it goes to pod Y, whose agent pulls the snapshot from X's agent over a slow link
    (`SlowLink`). Once part of the file has reached Y, X's agent is SIGKILLed and the link to it cut
    (the pod is gone). The pull must fail, Y must show no partial file under the snapshot's name, and
    the answer must be right without the snapshot (computed, or pulled again from elsewhere)."""
    r = ScenarioResult("kill -9 agent mid-transfer", "SIGKILL the agent a peer is pulling a snapshot from")
    started = time.monotonic()
    assert bed.fleet.index is not None
    index = bed.fleet.index.index
    cut = used = wrong = 0
    results, transfers = [], []
    for k in range(rounds):
        system = f"Session {k}. {SESSION}"
        reference = await bed.reference(QUESTIONS[1], 8, system)
        first = await send(bed.http, [bed.url], chat_body(bed.model, system, QUESTIONS[0], stream=False,
                                                          max_tokens=4), n=2 * k)
        results.append(first)
        x = next((i for i, p in enumerate(bed.fleet.pods) if p.layout.llama_url == first.pod), 0)
        y, source = 1 - x, bed.pod(x)
        target = bed.pod(y)

        async def saved(uid: str = source.layout.llama_url) -> bool:
            return any(s.name.startswith("fs-") for s in await index.snapshots(bed.model, uid))

        await until(saved, 10.0)
        names = {s.name for s in await index.snapshots(bed.model, source.layout.llama_url)
                 if s.name.startswith("fs-")}
        failed_before = _pull_failures(bed)
        restarts_before = source.restarts
        await _hold(bed, x, True)
        async with SlowLink(source.layout.agent_port) as link:
            await bed.route_agent(x, link.url)
            try:
                body = chat_body(bed.model, system, QUESTIONS[1], stream=True, max_tokens=8)
                pending = asyncio.create_task(send(bed.http, [bed.url], body, n=2 * k + 1, timeout=60.0))

                async def midway(link: SlowLink = link, pending: asyncio.Task[Sent] = pending) -> bool:
                    return link.file_bytes >= KILL_AFTER_BYTES or pending.done()

                await until(midway, 15.0, every=0.002)
                sent = link.file_bytes
                named_at_kill = _not_own(target.layout.snapshot_dir, names, target.name)
                kill(source.agent.pid)
                link.cut()  # its pod's network goes with it (link.py: why a kill alone cannot cut)
                answer = await pending
            finally:
                await bed.route_agent(x, source.layout.agent_url)
        await _hold(bed, x, False)
        results.append(answer)
        size = max((_size(source.layout.snapshot_dir, n) for n in names if n.startswith("fs-")), default=0)
        # Cut: the file had started to flow when its source died, and never arrived whole.
        was_cut = link.file_requests > 0 and 0 < sent < size and link.file_bytes < size
        failed = _pull_failures(bed) - failed_before
        cut += was_cut
        used += answer.snapshot in names and answer.pod == target.layout.llama_url
        right = answer.verdict == SUCCEEDED and agreement(answer.text, reference) >= 0.5
        wrong += not right
        # Y may hold the prefix now only as its own computation (first sight saves it there under the
        # same name), complete, never as a copy of X's file: the manifest says where its bytes came from.
        named = _not_own(target.layout.snapshot_dir, names, target.name)
        temps = [p.name for p in target.layout.snapshot_dir.glob(".pull-*")]
        transfers.append({"bytes_sent_before_kill": sent, "bytes_relayed": link.file_bytes, "size": size,
                          "pull_failures": int(failed), "action": answer.action})
        r.expect(was_cut, f"round {k}: no transfer was cut (file requests {link.file_requests}, "
                          f"{link.file_bytes} of {size} bytes relayed)")
        r.expect(failed >= 1, f"round {k}: the gateway saw no pull fail")
        r.expect(not named_at_kill and not named, f"round {k}: pod {y} shows {named_at_kill or named} "
                                                   "under its real name from the killed transfer")
        r.expect(not temps, f"round {k}: pod {y} kept the partial transfer {temps}")
        r.expect(right, f"round {k}: the answer was not right ({answer.verdict}, {answer.text!r} "
                        f"against {reference!r})")

        async def back(i: int = x, before: int = restarts_before) -> bool:
            """Supervise started pod i's agent again and it is ready: the next round needs it. (Its
            llama-server kept running, so the pod stayed routable; readiness alone says nothing.)"""
            pod = bed.fleet.pods[i]
            if pod.restarts <= before or pod.dead() is not None or not pod.ready:
                return False
            try:
                ready = (await bed.http.get(pod.layout.agent_url + "/ready", timeout=2.0)).status_code
            except httpx.HTTPError:
                return False
            return ready == 200 and await bed.pod_ready(i)

        back_s = await until(back, 60.0, every=0.1)
        r.expect(back_s is not None, f"round {k}: pod {x}'s agent was not started again within 60s")
    r.add(results)
    r.finish()
    r.wrongly_restored = used
    r.seconds = time.monotonic() - started
    await bed.check_leaks(r)
    r.checks.update({"transfers_cut": cut, "wrong_answers": wrong, "restarts": bed.fleet.progress.restarts,
                     "transfers": transfers})
    r.expect(r.other_failed == 0 and r.lost == 0, f"{r.other_failed} failed and {r.lost} lost")
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
    llama = LlamaClient(uid, bed.http, bed.fleet.pod_api_key)
    assert bed.fleet.manifest_key_file is not None
    agents_key = manifest_key(bed.fleet.manifest_key_file.read_text().strip())
    refused: dict[str, str] = {}
    accepted, results = 0, []
    await _hold(bed, 1, True)
    try:
        for n, how in enumerate(DAMAGES):
            damage(folder, name, how, agents_key)
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
    await bed.check_leaks(r)
    r.wrongly_restored = accepted
    r.seconds = time.monotonic() - started
    r.checks.update({"refused_by_agent": refused, "actions": [s.action for s in results]})
    r.expect(len(refused) == len(DAMAGES), f"the agent restored {sorted(set(DAMAGES) - set(refused))}")
    r.expect(accepted == 0, f"{accepted} damaged snapshots were restored")
    r.expect(r.other_failed == 0 and r.lost == 0, f"{r.other_failed} failed and {r.lost} lost")
    return r

"""Which patched flags the fleet's image accepts: learned once per image from a pod's agent.

Why through a pod: the operator cannot run the user's image itself, and a pod runs it anyway. A fleet whose
spec has an `auto` flag that could apply gets a detector init container (`render/pod.py`) that writes the
image's `llama-server --help` into the pod's `/tmp`; the agent parses it (`llamafleet_core.features`) and
answers `GET /v1/info`. The operator asks one running pod of the current image, records the answer in
`status.imageFeatures` keyed by the image, and renders from the record: the flag turns on in the next
pod template (one rollout), and every pod started later gets it from the start. A record for another
image is ignored, so a changed image starts `auto` off again until its own pods report.

The same answer names the pod's model file and that model's sliding window: llama-server attaches no
slot of a sliding-window model (patch 0003 refuses it), and a unified pool without attach only makes
every token attend over every slot's cells (Gemma 3 on patched pods: a 3rd session 0.68x plain), so
`attach: auto` stays off for it and the pods keep per-slot streams. The window is known together with
the image's flags, so such a fleet never rolls out a unified pool. After a model change the window is
unknown again (the image's flags stay) until a pod of the new model reports.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from llamafleet_core.agent_client import AgentError
from llamafleet_core.crd.models import ImageFeatures, LlamaFleetSpec
from llamafleet_core.podspec import model_path
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import Context, Log
from llamafleet_operator.status import now

DETECTOR = "detect-features"  # the init container's name (render/pod.py)
MAX_ASKED = 3  # pods asked per reconcile: a bound, not a retry policy (the next tick asks again)


def model_key(spec: LlamaFleetSpec) -> str:
    """What names the spec's model in a record (pure): its file, and a digest of the whole model spec
    (a new URL or sha256 under the same file name is another model)."""
    digest = hashlib.sha256(json.dumps(spec.model.to_k8s(), sort_keys=True).encode()).hexdigest()
    return f"{spec.model.file}#{digest[:12]}"


def recorded(spec: LlamaFleetSpec, raw: Mapping[str, Any] | None) -> ImageFeatures | None:
    """The status record, when it describes the spec's image (pure); its model part (the window) only
    when it describes the spec's model too."""
    if not raw:
        return None
    try:
        record = ImageFeatures.model_validate(raw)
    except ValidationError:
        return None
    if record.image != spec.image:
        return None
    if record.model and record.model != model_key(spec):
        return record.model_copy(update={"model": "", "sliding_window": None})
    return record


def model_unknown(spec: LlamaFleetSpec, record: ImageFeatures) -> bool:
    """Whether the record does not yet describe the spec's model (pure): ask the agents again. (A record
    from before the operator named the model counts as unknown too: one more answer, no rollout.)"""
    return record.model != model_key(spec)


def support(record: ImageFeatures | None) -> dict[str, bool]:
    """The `Target` options a record allows: nothing while unknown; no attach for a model with a
    sliding window."""
    known = record is not None and record.known
    return {"attach_supported": known and bool(record and record.slot_attach and not record.sliding_window),
            "cache_prefix_supported": known and bool(record and record.cache_prefix),
            "checkpoints_supported": known and bool(record and record.slot_checkpoints)}


def same(a: ImageFeatures | None, b: ImageFeatures | None) -> bool:
    """Equal but for the time: re-asking an unknown image each tick must not rewrite the status."""
    if a is None or b is None:
        return a is b
    return a.model_copy(update={"detected_at": ""}) == b.model_copy(update={"detected_at": ""})


def candidates(pods: Sequence[P.Pod], spec: LlamaFleetSpec) -> list[P.Pod]:
    """Running pods whose llama-server runs the spec's image on its model file and whose detector ran
    (pure), ready ones first. (Not a pod of the previous model while a rollout replaces it.)"""
    out = []
    for pod in pods:
        server = P.server_container(pod)
        detector = any(c.get("name") == DETECTOR for c in (pod.get("spec") or {}).get("initContainers") or ())
        if P.running(pod) and detector and server is not None and server.get("image") == spec.image and (
                P.server_arg(pod, "-m") in (None, model_path(spec))):
            out.append(pod)
    return sorted(out, key=lambda p: (not P.ready(p), P.name(p)))


def from_info(image: str, pod: str, info: Mapping[str, Any], model: str = "") -> ImageFeatures:
    """A record from an agent's `/v1/info` answer about the model `model` (`model_key`) (pure); no
    `features` at all means unknown."""
    features = info.get("features") or {}
    known = bool(features.get("known"))
    window = info.get("slidingWindow")
    return ImageFeatures(
        image=image, known=known, slot_attach=known and bool(features.get("slotAttach")),
        cache_prefix=known and bool(features.get("cachePrefix")),
        slot_checkpoints=known and bool(features.get("slotCheckpoints")), model=model,
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) and window > 0
        else None,
        pod=pod, detected_at=now(),
        message=str(features.get("message") or ("" if known else "the agent reported no features")),
    )


async def detect(ctx: Context, spec: LlamaFleetSpec, pods: Sequence[P.Pod],
                 logger: Log) -> ImageFeatures | None:
    """Ask up to MAX_ASKED pods of the current image and model; the first answer wins. None when none
    answered."""
    for pod in candidates(pods, spec)[:MAX_ASKED]:
        agent = ctx.agent_of(pod)
        try:
            info = await agent.info()
        except AgentError as exc:
            logger.debug(f"image features: agent of {P.name(pod)} did not answer: {exc.reason}")
            continue
        return from_info(spec.image, P.name(pod), info, model_key(spec))
    return None

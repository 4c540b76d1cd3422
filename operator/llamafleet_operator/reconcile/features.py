"""Which patched flags the fleet's image accepts: learned once per image from a pod's agent.

Why through a pod: the operator cannot run the user's image itself, and a pod runs it anyway. A fleet whose
spec has an `auto` flag that could apply gets a detector init container (`render/pod.py`) that writes the
image's `llama-server --help` into the pod's `/tmp`; the agent parses it (`llamafleet_core.features`) and
answers `GET /v1/info`. The operator asks one running pod of the current image, records the answer in
`status.imageFeatures` keyed by the image, and renders from the record: the flag turns on in the next
pod template (one rollout), and every pod started later gets it from the start. A record for another
image is ignored, so a changed image starts `auto` off again until its own pods report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from llamafleet_core.agent_client import AgentError
from llamafleet_core.crd.models import ImageFeatures, LlamaFleetSpec
from llamafleet_operator.reconcile import pods as P
from llamafleet_operator.reconcile.context import Context, Log
from llamafleet_operator.status import now

DETECTOR = "detect-features"  # the init container's name (render/pod.py)
MAX_ASKED = 3  # pods asked per reconcile: a bound, not a retry policy (the next tick asks again)


def recorded(spec: LlamaFleetSpec, raw: Mapping[str, Any] | None) -> ImageFeatures | None:
    """The status record, when it describes the spec's image (pure)."""
    if not raw:
        return None
    try:
        record = ImageFeatures.model_validate(raw)
    except ValidationError:
        return None
    return record if record.image == spec.image else None


def support(record: ImageFeatures | None) -> dict[str, bool]:
    """The `Target` options a record allows: nothing while unknown."""
    known = record is not None and record.known
    return {"attach_supported": known and bool(record and record.slot_attach),
            "cache_prefix_supported": known and bool(record and record.cache_prefix),
            "checkpoints_supported": known and bool(record and record.slot_checkpoints)}


def same(a: ImageFeatures | None, b: ImageFeatures | None) -> bool:
    """Equal but for the time: re-asking an unknown image each tick must not rewrite the status."""
    if a is None or b is None:
        return a is b
    return a.model_copy(update={"detected_at": ""}) == b.model_copy(update={"detected_at": ""})


def candidates(pods: Sequence[P.Pod], image: str) -> list[P.Pod]:
    """Running pods whose llama-server runs `image` and whose detector ran (pure), ready ones first."""
    out = []
    for pod in pods:
        spec = pod.get("spec") or {}
        server = next((c for c in spec.get("containers") or () if c.get("name") == "llama-server"), None)
        detector = any(c.get("name") == DETECTOR for c in spec.get("initContainers") or ())
        if P.running(pod) and detector and server is not None and server.get("image") == image:
            out.append(pod)
    return sorted(out, key=lambda p: (not P.ready(p), P.name(p)))


def from_info(image: str, pod: str, info: Mapping[str, Any]) -> ImageFeatures:
    """A record from an agent's `/v1/info` answer (pure); no `features` at all means unknown."""
    features = info.get("features") or {}
    known = bool(features.get("known"))
    return ImageFeatures(
        image=image, known=known, slot_attach=known and bool(features.get("slotAttach")),
        cache_prefix=known and bool(features.get("cachePrefix")),
        slot_checkpoints=known and bool(features.get("slotCheckpoints")), pod=pod, detected_at=now(),
        message=str(features.get("message") or ("" if known else "the agent reported no features")),
    )


async def detect(ctx: Context, spec: LlamaFleetSpec, pods: Sequence[P.Pod],
                 logger: Log) -> ImageFeatures | None:
    """Ask up to MAX_ASKED pods of the current image; the first answer wins. None when none answered."""
    for pod in candidates(pods, spec.image)[:MAX_ASKED]:
        agent = ctx.agent_of(pod)
        try:
            info = await agent.info()
        except AgentError as exc:
            logger.debug(f"image features: agent of {P.name(pod)} did not answer: {exc.reason}")
            continue
        return from_info(spec.image, P.name(pod), info)
    return None

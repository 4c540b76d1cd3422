"""The index's head families, as first sight uses them: read before a head's build, recorded after.

`divergence.py` decides (pure); this module does the two index calls around it. Both happen only when
a head is built (a first sight), never on an ordinary request, and neither can fail the request: a
family the index cannot read is an empty one (the head's stage points still apply), and a record that
fails is lost (the next first sight of the family learns the point again).
"""

from __future__ import annotations

import logging

from llamafleet_core.index.base import PrefixIndex
from llamafleet_core.types import DivergencePoint, HeadFamily, HeadRecord, Lookup, SnapshotRef
from llamafleet_router.background import TaskSet
from llamafleet_router.snapshots.base import SnapshotConfig
from llamafleet_router.snapshots.divergence import family_of, learned_cuts
from llamafleet_router.snapshots.flights import Prompt

log = logging.getLogger(__name__)


class HeadFamilies:
    def __init__(self, *, index: PrefixIndex, tasks: TaskSet, config: SnapshotConfig) -> None:
        self._index = index
        self._tasks = tasks
        self._config = config

    async def cuts_for(
        self, prompt: Prompt, lookup: Lookup, restored: SnapshotRef | None = None,
    ) -> list[int]:
        """The learned cuts the build of `prompt`'s head saves beyond its stage points; records the head
        in its family, with the divergence point it parts at, in the background. `restored`: the stage
        the request's slot resumes from, if any."""
        family_key = family_of(prompt.blocks)
        if family_key is None:
            return []
        family = await self._read(prompt.model, family_key)
        config = self._config
        learned = learned_cuts(
            prompt.text, prompt.head_chars, prompt.blocks, family, lookup.slots.values(),
            block_chars=config.block_chars, min_chars=config.first_sight_min_chars, limit=config.learned_cuts,
            held=_held(prompt, lookup, restored), hasher=prompt.hasher)
        head = learned.head
        assert head is not None  # learned_cuts always returns the head's record
        points = (learned.point,) if learned.point is not None else ()
        if learned.point is not None:
            log.info("divergence point learned", extra={
                "model": prompt.model, "chars": learned.point.chars, "from_end": learned.point.from_end})
        self._tasks.spawn(self._record(prompt.model, family_key, head, points), name="record-head")
        return list(learned.cuts)

    async def _read(self, model: str, family_key: str) -> HeadFamily:
        try:
            return await self._index.family(model, family_key)
        except Exception as exc:  # the index is a hint: no family known is a valid answer
            log.info("reading a head family failed", extra={"error": str(exc)})
            return HeadFamily()

    async def _record(
        self, model: str, family_key: str, head: HeadRecord, points: tuple[DivergencePoint, ...],
    ) -> None:
        try:
            await self._index.record_head(model, family_key, head, points)
        except Exception as exc:
            log.info("recording a head family failed", extra={"error": str(exc)})


def _held(prompt: Prompt, lookup: Lookup, restored: SnapshotRef | None) -> list[int]:
    """Lengths of the exact prefixes of the prompt's head that snapshots hold (its stages)."""
    snaps = [*lookup.snapshots, *((restored,) if restored is not None else ())]
    return [s.n_chars for s in snaps
            if s.text_hash and s.n_chars < prompt.head_chars and s.extended_by(prompt.text, prompt.hasher)]

"""Value types shared by the router, the agent and the operator.

They are frozen dataclasses: cheap to build in tests by hand, hashable so plugins can key maps by them,
and free of any client library so that `llamafleet_core` stays importable everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class PodRef:
    """One llama-server pod, fenced by its start epoch.

    `uid` is stable for the life of the pod process (Kubernetes pod uid, or `name@epoch` locally).
    Index entries carry it, so a restarted or replaced pod never inherits its predecessor's entries.
    """

    name: str
    uid: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What the router knows about a pod it may send requests to."""

    pod: PodRef
    url: str  # llama-server base URL, e.g. http://10.0.0.5:8080
    model: str  # the model name clients use (the fleet's model)
    n_slots: int
    agent_url: str | None = None  # the snapshot agent beside it, if any
    ready: bool = True
    attach: bool = False  # a patched build with --slot-attach
    cache_prefix: bool = False  # a patched build with --cache-prefix: RAM entries of heads (`ram_slot`)
    # False when the model's slots resume only at llama-server's context checkpoints (recurrent or
    # sliding-window layers, see gguf_meta.py): a slot holding more than the prompt shares gives less.
    resume_anywhere: bool = True
    # False when the pod's agent found that its server does not resume from a restored slot (a sliding
    # window on upstream llama-server: agent/restore_check.py): no restores, primes or snapshots there.
    restores: bool = True
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def uid(self) -> str:
        return self.pod.uid


def ram_slot(head_tag: str) -> int:
    """The slot number under which the index records the RAM prefix entry a --cache-prefix pod keeps of
    one head (`PromptTags.head`): not a slot any request is pinned to, but what every slot of the pod
    may load. Negative, so that every reader of slot numbers in [0, n_slots) passes over it; one per
    head, so that a pod keeping the heads of several agents has a record for each (a record replaces
    what the same slot number held before)."""
    return -1 - int(hashlib.sha256(head_tag.encode()).hexdigest()[:8], 16)


class SlotRef(NamedTuple):
    """One slot of one pod.

    A tuple, not a dataclass: every scorer keys its answer by SlotRef, and a decision over 1,000 index
    entries hashes and compares ~700 of them. A tuple hashes and compares in C; the dataclass ran a
    Python `__hash__` and `__eq__` for each (with a cached hash, still ~15% of the decision)."""

    pod_uid: str
    slot: int

    def key(self) -> str:
        return f"{self.pod_uid}#{self.slot}"

    @classmethod
    def parse(cls, key: str) -> SlotRef:
        uid, _, slot = key.rpartition("#")
        return cls(uid, int(slot))


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """A saved slot state: a file in one pod's snapshot folder holding an exact token prefix."""

    name: str
    pod_uid: str
    n_blocks: int  # how many prefix blocks (of the block chain) the snapshot covers exactly
    n_tokens: int
    size_bytes: int
    last_block: str = ""  # hash of its last covered block: identifies the prefix it holds
    # The exact text the snapshot holds is the first `n_chars` characters of the rendered prompt, with
    # `text_hash` = `exact_text_hash` of them. Blocks cover only whole blocks; a hybrid (recurrent)
    # model resumes only from a snapshot that the prompt extends exactly, so the tail is checked too.
    n_chars: int = 0
    text_hash: str = ""

    def extended_by(self, text: str, hasher: Callable[[str], str] | None = None) -> bool:
        """Whether `text` starts with exactly what this snapshot holds (unknown text: assume yes).
        `hasher`: the one its `text_hash` was made with (the fleet's key and the tenant's namespace)."""
        if not self.text_hash:
            return True
        if len(text) < self.n_chars:
            return False
        return (hasher or exact_text_hash)(text[: self.n_chars]) == self.text_hash


_TEXT_PERSON = b"llamafleet/text"


def exact_text_hash(text: str, key: bytes = b"", namespace: str = "") -> str:
    """The identity of an exact prefix text (snapshots record it, name themselves by it; the router checks
    requests against it). Keyed with the fleet's `prefix_key` (`prefix_key_bytes`), so whoever reads the
    index or a snapshot folder's names cannot test a guessed prompt offline; in a tenant `namespace`,
    so two tenant groups never share a snapshot name or a first-sight flight. Neither: unkeyed, as
    before (snapshots saved without a key keep their names)."""
    data = text.encode("utf-8", "surrogatepass")
    if not key and not namespace:
        return hashlib.blake2b(data, digest_size=16).hexdigest()
    scope = namespace.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(len(scope).to_bytes(4, "big") + scope, digest_size=16, key=key, person=_TEXT_PERSON)
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class TextHasher:
    """`exact_text_hash` with one fleet key and one tenant namespace: what a request's prompt identity
    hashes its exact prefixes with (`PromptIdentity.hasher`). The key is never printed."""

    key: bytes = field(default=b"", repr=False)
    namespace: str = ""

    def __call__(self, text: str) -> str:
        return exact_text_hash(text, self.key, self.namespace)


UNKEYED = TextHasher()  # no key, the common namespace: the hashes of a fleet without `prefix_key`


@dataclass(frozen=True, slots=True)
class Lookup:
    """Longest-match result of one index lookup for one request's block chain.

    `slots` maps each (pod, slot) that holds a run of the chain to how many leading blocks it holds.
    `snapshots` lists snapshots whose prefix is a prefix of the chain, with their matched block count.
    """

    slots: dict[SlotRef, int] = field(default_factory=dict)
    snapshots: tuple[SnapshotRef, ...] = ()
    # The slot whose latest recorded prompt had the conversation tag the lookup asked about (the
    # previous turn of this conversation), when it still holds it.
    conversation: SlotRef | None = None
    # Of the slots holding exactly the head's whole blocks (`PromptTags.head_blocks`), those whose
    # latest prompt had this head exactly: whole blocks alone cannot tell them from slots whose text
    # parts from the head inside its last, partial block (another day's date line).
    exact_head: frozenset[SlotRef] = frozenset()

    def best_slot_blocks(self) -> int:
        return max(self.slots.values(), default=0)


@dataclass(frozen=True, slots=True)
class PromptTags:
    """Exact identities of two points of a chat prompt that its whole blocks cannot pin down, recorded
    with a slot and asked about in a lookup (`PromptIdentity.tags`).

    `head`: the text before the first user message (tools and system prompt), whose `head_blocks`
    whole blocks the chain covers; `conversation`: the text through the end of the first user message,
    the same for every turn of one conversation."""

    head: str | None = None
    head_blocks: int = 0
    conversation: str | None = None


class Action(StrEnum):
    """What the router does with the chosen slot before forwarding."""

    DIRECT = "direct"  # the slot already holds the prefix (or nothing helps): forward pinned
    RESTORE = "restore"  # restore a snapshot into the slot first
    COMPUTE = "compute"  # nothing holds the prefix: compute it (and, later, snapshot it)


@dataclass(frozen=True, slots=True)
class HeadRecord:
    """A head (the text before the first user message: tools and system prompt) the fleet built.

    `cuts` is a hash chain over the head's safe token cuts (line starts and special tokens: hash k
    covers the text up to the k-th cut), `n_chars` its length, `text_hash` its exact identity.
    Comparing a new head's chain with those of its family tells, to the line, where the new one parts
    from what the fleet built, even when no slot holds those heads any more (pods restarted) and no
    snapshot of theirs is a prefix of the new one. Hashes only: the index never holds prompt text."""

    cuts: tuple[str, ...]
    n_chars: int
    text_hash: str = ""


@dataclass(frozen=True, slots=True)
class DivergencePoint:
    """A cut where heads of one family were seen to part: `chars` from the head's start (a safe token
    cut), `from_end` the same place counted from that head's end, and `text_hash` the exact identity of
    the text before it. Learned from traffic, so a layout no one foresaw (a date, a session id, an
    environment block anywhere in the system prompt) is learned like any other."""

    chars: int
    from_end: int
    text_hash: str


@dataclass(frozen=True, slots=True)
class HeadFamily:
    """What the index knows of one family of heads (heads sharing their first block): the latest heads
    built, newest first, and the divergence points learned between them, newest first."""

    heads: tuple[HeadRecord, ...] = ()
    points: tuple[DivergencePoint, ...] = ()

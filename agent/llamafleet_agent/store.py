"""The snapshot folder: names to paths, manifests, in-use counts and the byte budget (LRU eviction).

Layout: `<name>.bin` (llama-server's slot file) and `<name>.json` (its manifest), written in that order so
that a manifest never names a file that is not there yet. Every name the agent itself makes starts with a
dot (temp files, the model-digest cache), and snapshot names may not, so the two never collide.

A snapshot counts only once its manifest exists; a `.bin` without one is debris of a crash and is not
listed, restored or served.

Every manifest is signed when written and verified when read (`llamafleet_core.snapshot_signing`):
llama-server's container can write this folder too, so a manifest whose signature does not verify was
not written by an agent. It is refused AND deleted with its file (counted by `on_untrusted`), so a
planted snapshot is neither listed for the gateway's index nor kept to be tried again.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ValidationError

from llamafleet_agent.files import SymlinkRefused, read_json_nofollow, write_atomic
from llamafleet_core.snapshot import SnapshotManifest, valid_snapshot_name
from llamafleet_core.snapshot_signing import manifest_signed, sign_manifest

TEMP_PREFIXES = (".save-", ".pull-", ".probe-")  # restore_check.py makes the last


class Refused(Exception):
    """A request the agent will not carry out; `kind` is the metric label, `reason` is for people."""

    def __init__(self, kind: str, reason: str, status: int = 409) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.status = status


class SnapshotStore:
    def __init__(self, root: Path, budget_bytes: int, *, signing_key: bytes,
                 on_untrusted: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self._key = signing_key
        self._on_untrusted = on_untrusted  # called with a reason for every snapshot deleted as untrusted
        self._in_use: Counter[str] = Counter()
        self._last_used: dict[str, float] = {}
        self._doomed: set[str] = set()  # untrusted, deleted once no reader holds them (`discard`)

    # ---- names and paths -------------------------------------------------------------------------
    def check_name(self, name: str) -> str:
        if not valid_snapshot_name(name):
            raise Refused("name", f"invalid snapshot name {name[:80]!r}", 400)
        return name

    def bin_path(self, name: str) -> Path:
        return self.root / f"{self.check_name(name)}.bin"

    def manifest_path(self, name: str) -> Path:
        return self.root / f"{self.check_name(name)}.json"

    def temp_path(self, kind: str) -> Path:
        """A fresh dot-name in the folder itself, so the final os.replace is an atomic same-disk rename."""
        return self.root / f".{kind}-{uuid.uuid4().hex}.bin"

    def cleanup_temps(self) -> int:
        """Delete temp files a crashed save or pull left behind; run at start-up."""
        removed = 0
        for entry in self.root.iterdir():
            if entry.name.startswith(TEMP_PREFIXES):
                entry.unlink(missing_ok=True)
                removed += 1
        return removed

    # ---- manifests ------------------------------------------------------------------------------
    def read_manifest(self, name: str) -> SnapshotManifest:
        path = self.manifest_path(name)
        try:
            data = read_json_nofollow(path)
        except SymlinkRefused as exc:
            raise Refused("symlink", f"snapshot {name} is a symlink", 409) from exc
        except FileNotFoundError as exc:
            raise Refused("not_found", f"no snapshot {name}", 404) from exc
        except (OSError, ValueError) as exc:
            raise Refused("manifest", f"unreadable manifest for {name}: {exc}", 409) from exc
        try:
            manifest = SnapshotManifest.model_validate(data)
        except ValidationError as exc:
            raise Refused("manifest", f"invalid manifest for {name}", 409) from exc
        if manifest.name != name:
            raise Refused("manifest", f"manifest names {manifest.name!r}, not {name!r}", 409)
        if not manifest_signed(manifest, self._key):
            self.discard(name, "signature")
            # 404: the snapshot is gone now; a warmer that asks whether the pod holds it builds it again.
            raise Refused("signature", f"the manifest of {name} is not signed by an agent; deleted", 404)
        return manifest

    def write_manifest(self, manifest: SnapshotManifest) -> SnapshotManifest:
        """Sign `manifest` and write it; returns the signed manifest."""
        signed = sign_manifest(manifest, self._key)
        write_atomic(self.manifest_path(signed.name), signed.model_dump_json(indent=1).encode())
        self._doomed.discard(signed.name)  # a fresh snapshot under the name is not the untrusted one
        self.touch(signed.name)
        return signed

    def signed(self, manifest: SnapshotManifest) -> bool:
        """Whether `manifest` (e.g. a peer's) carries a valid signature of this agents' key."""
        return manifest_signed(manifest, self._key)

    def discard(self, name: str, reason: str) -> None:
        """Delete an untrusted snapshot (a bad signature, a file that does not match its manifest) and
        count it. One being read (served, restored) is deleted as soon as its last reader lets go."""
        if self.is_in_use(name):
            self._doomed.add(name)
        else:
            with contextlib.suppress(Refused):
                self.delete(name)
        if self._on_untrusted is not None:
            self._on_untrusted(reason)

    def list_all(self) -> list[SnapshotManifest]:
        result = []
        for entry in sorted(self.root.glob("*.json")):
            name = entry.name[: -len(".json")]
            if not valid_snapshot_name(name) or entry.is_symlink():
                continue
            with contextlib.suppress(Refused):
                result.append(self.read_manifest(name))
        return result

    def total_bytes(self) -> int:
        return sum(m.size for m in self.list_all())

    def delete(self, name: str) -> bool:
        """Remove manifest then file; refuse while the snapshot is being served or restored."""
        if self._in_use[name]:
            raise Refused("in_use", f"snapshot {name} is in use", 409)
        found = False
        for path in (self.manifest_path(name), self.bin_path(name)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                found = True
        self._last_used.pop(name, None)
        return found

    # ---- use tracking and the budget ------------------------------------------------------------
    @contextlib.contextmanager
    def in_use(self, name: str) -> Iterator[None]:
        """Hold a snapshot while its file is read (served, hashed, restored): eviction skips it."""
        self._in_use[name] += 1
        try:
            yield
        finally:
            self._in_use[name] -= 1
            if not self._in_use[name]:
                del self._in_use[name]
                if name in self._doomed:
                    self._doomed.discard(name)
                    with contextlib.suppress(Refused):
                        self.delete(name)

    def is_in_use(self, name: str) -> bool:
        return self._in_use[name] > 0

    def touch(self, name: str) -> None:
        self._last_used[name] = time.time()

    def last_used(self, manifest: SnapshotManifest) -> float:
        if manifest.name in self._last_used:
            return self._last_used[manifest.name]
        # Not used since this process started: fall back to when the manifest was last written.
        try:
            return os.stat(self.manifest_path(manifest.name), follow_symlinks=False).st_mtime
        except OSError:
            return manifest.created_at.timestamp()

    def evict_for(self, incoming: int, keep: frozenset[str] = frozenset()) -> list[SnapshotManifest]:
        """Delete least recently used snapshots until `incoming` more bytes fit in the budget.

        Unpinned snapshots go first, pinned ones only when nothing else is left; snapshots in use and
        those in `keep` are never deleted. Returns what was evicted (the budget may still be exceeded
        when everything left is protected: a pull or save still succeeds rather than losing work).
        """
        manifests = self.list_all()
        total = sum(m.size for m in manifests)
        candidates = sorted(
            (m for m in manifests if m.name not in keep and not self.is_in_use(m.name)),
            key=lambda m: (m.pinned, self.last_used(m)),
        )
        evicted = []
        for manifest in candidates:
            if total + incoming <= self.budget_bytes:
                break
            with contextlib.suppress(Refused):
                self.delete(manifest.name)
                total -= manifest.size
                evicted.append(manifest)
        return evicted

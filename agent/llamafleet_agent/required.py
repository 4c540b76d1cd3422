"""The snapshots this pod must hold before it may receive traffic (its fleet's SharedPrefixes).

Why the agent, and why a declared list: a new pod computes a 14K-token prefix in seconds on a GPU for
every session that lands on it cold, so it must not be routable until it holds the fleet's shared
snapshots; only the agent knows what its folder holds, and only the warmer (the operator, or `llamafleet
up`) knows which snapshots the fleet needs. The warmer declares them with `PUT /v1/required`; `GET /ready`
answers 503 naming the missing ones until every one is present and fits this pod.

The list is kept in the snapshot folder (`.required.json`, a dot name no snapshot can take), so a
restarted agent container keeps its requirements as long as the folder survives. With
`await_required`, the pod is also unready until a list was declared at all (possibly empty): otherwise a
pod created just after a SharedPrefix would be ready before anyone told it what to require.

"Present" means: manifest and file both there, the file's size equals the manifest's, and the manifest's
fingerprint fits this pod. The checksum is not recomputed on every probe (seconds for large snapshots);
it was verified when the file arrived (pull) or was written (save), and is verified again on restore.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable

from llamafleet_agent.files import SymlinkRefused, read_json_nofollow, write_atomic
from llamafleet_agent.store import Refused, SnapshotStore
from llamafleet_core.agent_client import RequiredStatus
from llamafleet_core.snapshot import Fingerprint, fingerprint_mismatch

REQUIRED_FILE = ".required.json"
MAX_REQUIRED = 256


class Requirements:
    def __init__(self, store: SnapshotStore, *, await_declaration: bool) -> None:
        self.store = store
        self.path = store.root / REQUIRED_FILE
        self.await_declaration = await_declaration
        self.names: frozenset[str] = frozenset()
        self.declared = False

    def load(self) -> None:
        """Read the persisted list, if any (start-up). An unreadable file counts as undeclared."""
        try:
            data = read_json_nofollow(self.path)
        except (FileNotFoundError, SymlinkRefused, OSError, ValueError):
            return
        names = data.get("snapshots") if isinstance(data, dict) else None
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            with contextlib.suppress(Refused):
                self.names = self._checked(names)
                self.declared = True

    def _checked(self, names: Iterable[str]) -> frozenset[str]:
        result = frozenset(self.store.check_name(n) for n in names)
        if len(result) > MAX_REQUIRED:
            raise Refused("body", f"at most {MAX_REQUIRED} required snapshots", 400)
        return result

    def set(self, names: Iterable[str]) -> None:
        """Replace the list (level-based: the caller always sends the whole set)."""
        checked = self._checked(names)
        write_atomic(self.path, json.dumps({"snapshots": sorted(checked)}).encode())
        self.names, self.declared = checked, True

    def _present(self, name: str, fingerprint: Fingerprint | None) -> bool:
        try:
            manifest = self.store.read_manifest(name)
            st = os.lstat(self.store.bin_path(name))
        except (Refused, OSError):
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != manifest.size:
            return False
        return fingerprint is None or fingerprint_mismatch(manifest.fingerprint, fingerprint) is None

    def missing(self, fingerprint: Fingerprint | None) -> list[str]:
        """Required snapshots this pod does not hold in usable form, sorted."""
        return sorted(n for n in self.names if not self._present(n, fingerprint))

    def satisfied(self, missing: list[str]) -> bool:
        return not missing and (self.declared or not self.await_declaration)

    def status(self, fingerprint: Fingerprint | None) -> RequiredStatus:
        missing = self.missing(fingerprint)
        return RequiredStatus(
            required=sorted(self.names), missing=missing, declared=self.declared,
            satisfied=self.satisfied(missing),
        )

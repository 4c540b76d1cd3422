"""Signed snapshot manifests: what binds a snapshot's file to the tokens and the text it claims.

A manifest names the file's sha256, its token ids' hash, the prefix text it holds (`n_chars`,
`text_hash`, `blocks`) and where it may be restored. The snapshot folder is also llama-server's
`--slot-save-path`, mounted read-write into a container that runs the fleet author's image and parses
every request; a manifest that only carried a checksum could be rewritten there (or sent by a lying
peer) to advertise KV computed for other text, which the gateway would then restore into other
tenants' requests. So the agent that saves a snapshot signs its manifest, and every agent verifies the
signature before it lists, serves, restores or accepts one:

    signature = hex(HMAC-SHA256(key, canonical JSON of every other field))

The key is one only agents hold. By default it is derived from the agent token, which is mounted into
the agent container only (never into llama-server's); a deployment can give a key of its own instead
(`signing_key_file`). Agents that pull from each other must hold the same key: the agents of one
namespace share their token, hence their key. A token rotation therefore invalidates the snapshots
signed before it: they are refused and deleted, and built again when needed.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from llamafleet_core.snapshot import SnapshotManifest

_KEY_CONTEXT = b"llamafleet snapshot manifests\0"


def manifest_key(secret: str) -> bytes:
    """The signing key derived from a secret (the agent token or a configured key); 32 bytes."""
    if not secret:
        raise ValueError("no secret to derive the manifest key from")
    return hmac.new(secret.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def _canonical(manifest: SnapshotManifest) -> bytes:
    data = manifest.model_dump(mode="json", exclude={"signature"})
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_mac(manifest: SnapshotManifest, key: bytes) -> str:
    return hmac.new(key, _canonical(manifest), hashlib.sha256).hexdigest()


def sign_manifest(manifest: SnapshotManifest, key: bytes) -> SnapshotManifest:
    """`manifest` with its signature (any previous one replaced)."""
    return manifest.model_copy(update={"signature": manifest_mac(manifest, key)})


def manifest_signed(manifest: SnapshotManifest, key: bytes) -> bool:
    """True when the manifest's signature is the one `key` gives (constant-time compare)."""
    return bool(manifest.signature) and hmac.compare_digest(manifest.signature, manifest_mac(manifest, key))

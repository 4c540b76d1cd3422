"""Signed fleet membership: the operator seals each member entry, routers check the seal.

Whoever can write Redis would otherwise choose where prompts go (a member entry is an address). With a
membership key (`membership_key` / `membership_key_file` on the operator and on every router; the chart
generates one Secret that only those two mount) each entry carries `sig`: an HMAC-SHA256, under that
key, of the entry's canonical JSON (sorted keys, no spaces, `sig` left out) bound to the key prefix,
namespace and fleet whose hash holds it, so a forged entry, an edited one or one copied from another
fleet is refused. Routers without a key ignore `sig`; routers with one refuse entries without it.

It does not stop a replay of an entry this fleet once had (a pod that left): the address gate
(`member_networks`) and the router's own polls of the pod bound that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

SIGNATURE_FIELD = "sig"
_KEY_CONTEXT = b"llamafleet membership key v1"
_MESSAGE_CONTEXT = "llamafleet member v1"


class BadSeal(ValueError):
    """An entry that is not accepted; `reason` is `unsigned` (no signature) or `signature` (wrong)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Scope:
    """Where an entry is stored: what its signature binds it to."""

    prefix: str
    namespace: str
    fleet: str


def membership_key(secret: str) -> bytes:
    """The 32-byte signing key made from a configured secret; b"" (no secret): entries are unsigned."""
    if not secret:
        return b""
    return hmac.new(secret.encode("utf-8", "surrogatepass"), _KEY_CONTEXT, hashlib.sha256).digest()


def canonical(data: dict[str, Any]) -> str:
    """The entry's signed text: sorted keys, no spaces, without the signature."""
    body = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def signature(text: str, scope: Scope, key: bytes) -> str:
    # A JSON list keeps the parts apart unambiguously (no separator a name could contain).
    message = json.dumps([_MESSAGE_CONTEXT, scope.prefix, scope.namespace, scope.fleet, text])
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def seal(text: str, scope: Scope, key: bytes) -> str:
    """`text` (a JSON object) with its signature added, canonical again."""
    data: dict[str, Any] = json.loads(text)
    data[SIGNATURE_FIELD] = signature(canonical(data), scope, key)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def unseal(raw: str | bytes, scope: Scope, key: bytes) -> dict[str, Any]:
    """The entry's fields when its signature is right for `scope`; raises BadSeal otherwise."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise BadSeal("unsigned") from None
    if not isinstance(data, dict) or not isinstance(data.get(SIGNATURE_FIELD), str):
        raise BadSeal("unsigned")
    given = data[SIGNATURE_FIELD].encode("utf-8", "surrogatepass")
    if not hmac.compare_digest(given, signature(canonical(data), scope, key).encode()):
        raise BadSeal("signature")
    data.pop(SIGNATURE_FIELD)
    return data

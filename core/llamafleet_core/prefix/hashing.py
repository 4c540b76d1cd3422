"""Block-hash chain of a rendered prompt: the keys of the prefix index.

The prompt text is cut into fixed-size blocks of characters and hash i covers blocks 0..i
(h_i = H(h_{i-1} || block_i)). So one hash names a whole prefix: two prompts share their first k
hashes exactly when they share their first k*block_chars characters (up to 64-bit collisions),
and the index can answer "longest held prefix" by looking hashes up, with no text comparison.

Characters rather than tokens: the router must hash before any tokenizer runs, and the chat
template's special-token boundaries (where the session cut lands) are character positions.

The chain is seeded with the model name, so two models never share a hash even for equal text, and
with a tenant namespace where keys are isolated (`namespaced_seed`): one group's prompts never match
another's entries. Only full blocks are hashed: a partial tail block would change as the prompt grows
and would never match anything stored.

Keyed (`key`, from `prefix_key`): without the key, whoever reads the index cannot test a guessed prompt
against it offline. Every component that writes or reads the same entries (the routers, the operator's
or `llamafleet up`'s warming) must hash with the same key; an empty key hashes as before, unkeyed. A
keyed blake2b is copied from one keyed state per key, so the key costs no extra compression per block.

Cost: about 0.2 ms for 60K characters (234 blake2b calls over 256-character blocks).
"""

from __future__ import annotations

from functools import lru_cache
from hashlib import blake2b

BLOCK_CHARS = 256
DIGEST_BYTES = 8
_SEED_DOMAIN = b"llamafleet/prefix/v1\x00"
_KEY_PERSON = b"llamafleet/key"


def prefix_key_bytes(secret: str) -> bytes:
    """The 32-byte hash key made from a configured secret of any length (b"" for none: unkeyed)."""
    if not secret:
        return b""
    return blake2b(secret.encode("utf-8", "surrogatepass"), digest_size=32, person=_KEY_PERSON).digest()


def namespaced_seed(model: str, namespace: str = "") -> str:
    """The chain seed of `model` for one tenant namespace ("" is the namespace every key shares)."""
    return f"{model}\x00{namespace}" if namespace else model


@lru_cache(maxsize=8)
def _keyed(key: bytes) -> blake2b:
    """A keyed state that nothing updates: each block hash starts from a copy of it."""
    return blake2b(digest_size=DIGEST_BYTES, key=key)


def _block_hash(prev: bytes, key: bytes) -> blake2b:
    if not key:
        return blake2b(prev, digest_size=DIGEST_BYTES)
    h = _keyed(key).copy()
    h.update(prev)
    return h


def chain_seed(seed: str, key: bytes = b"") -> bytes:
    """h_{-1}: the digest the chain starts from, a function of the model name (and namespace) only."""
    return blake2b(_SEED_DOMAIN + seed.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES,
                   key=key).digest()


def block_chain(text: str, *, seed: str, block_chars: int = BLOCK_CHARS, key: bytes = b"") -> tuple[str, ...]:
    """Hex hashes of every full `block_chars`-character block of `text`, each covering all before it."""
    if block_chars <= 0:
        raise ValueError("block_chars must be positive")
    prev = chain_seed(seed, key)
    out: list[str] = []
    full = len(text) - len(text) % block_chars
    for start in range(0, full, block_chars):
        h = _block_hash(prev, key)
        h.update(text[start:start + block_chars].encode("utf-8", "surrogatepass"))
        prev = h.digest()
        out.append(prev.hex())
    return tuple(out)


def extend_chain(
    chain: tuple[str, ...], text: str, *, seed: str, block_chars: int = BLOCK_CHARS, key: bytes = b""
) -> tuple[str, ...]:
    """`block_chain(text)` reusing `chain`, already computed for a prefix of `text` (not checked)."""
    if block_chars <= 0:
        raise ValueError("block_chars must be positive")
    prev = bytes.fromhex(chain[-1]) if chain else chain_seed(seed, key)
    out = list(chain)
    full = len(text) - len(text) % block_chars
    for start in range(len(chain) * block_chars, full, block_chars):
        h = _block_hash(prev, key)
        h.update(text[start:start + block_chars].encode("utf-8", "surrogatepass"))
        prev = h.digest()
        out.append(prev.hex())
    return tuple(out)


def common_blocks(a: tuple[str, ...] | list[str], b: tuple[str, ...] | list[str]) -> int:
    """How many leading hashes `a` and `b` share: the shared prefix length in blocks.

    Because each hash covers everything before it, the first mismatch ends the shared prefix.
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_tag(
    chain: tuple[str, ...], text: str, end: int, *, seed: str, block_chars: int = BLOCK_CHARS,
    key: bytes = b"",
) -> str:
    """An exact identity of `text[:end]`, for `chain` = the block chain of `text` (or of a longer text
    sharing its first `end` characters): the hash of the last whole block before `end` followed by
    the characters after it. Exact like a hash of the whole prefix, at the cost of one block."""
    if block_chars <= 0:
        raise ValueError("block_chars must be positive")
    k = min(end // block_chars, len(chain))
    prev = bytes.fromhex(chain[k - 1]) if k else chain_seed(seed, key)
    h = blake2b(prev, digest_size=16, person=b"llamafleet/tag", key=key)
    h.update(text[k * block_chars:end].encode("utf-8", "surrogatepass"))
    return h.hexdigest()

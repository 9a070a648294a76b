"""Chained page keys.

Each namespace has a root key `H(fingerprint, namespace)` (`H(generation, fingerprint,
namespace)` once a flush advanced its generation, in a hash domain of its own); each page's key
is `H(parent_key, tokens)`. H is BLAKE2b-128: keyed chains must not collide even for inputs an
attacker chooses (two namespaces never share a page), and the raw namespace string never
reaches disk, only its hash.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

KEY_BYTES = 16
_PAGE_HASH = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-page")  # copied per page


@lru_cache(maxsize=4096)  # fixed per (fingerprint, namespace): match and insert ask every call
def namespace_root_key(
    fingerprint: bytes, namespace: str, generation: tuple[int, int] = (0, 0)
) -> bytes:
    """The root key of a namespace's chain under one model fingerprint, in its flush
    `generation` (`FlushGenerations.of`: every page key below changes when it advances)."""
    if generation == (0, 0):
        h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-ns")
    else:
        h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-ns-gen")
        h.update(struct.pack("<QQ", *generation))
    h.update(len(fingerprint).to_bytes(4, "little"))
    h.update(fingerprint)
    h.update(namespace.encode("utf-8"))
    return h.digest()


def page_key(parent_key: bytes, tokens: Sequence[int] | np.ndarray) -> bytes:
    """The key of a page holding `tokens` whose parent page (or namespace root) is `parent_key`."""
    h = _PAGE_HASH.copy()
    h.update(parent_key)
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return h.digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """`tokens` as int32 little-endian bytes, the bytes `page_key` hashes (struct packs a list
    of ints several times faster than numpy converts it)."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def chain_keys(parent_key: bytes, tokens: Sequence[int], page_size: int) -> list[bytes]:
    """Keys of the consecutive full pages of `tokens` under `parent_key` (equal, page by
    page, to chaining `page_key`); the tokens are converted to bytes once."""
    return chain_packed_keys(parent_key, token_bytes(tokens), page_size)


def chain_packed_keys(parent_key: bytes, packed: bytes, page_size: int) -> list[bytes]:
    """`chain_keys` of tokens already packed by `token_bytes`."""
    keys = []
    data = memoryview(packed)
    step = 4 * page_size
    for start in range(0, len(data) - step + 1, step):
        h = _PAGE_HASH.copy()
        h.update(parent_key)
        h.update(data[start : start + step])
        parent_key = h.digest()
        keys.append(parent_key)
    return keys

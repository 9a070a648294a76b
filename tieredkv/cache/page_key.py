"""Chained page keys.

Each namespace has a root key `H(fingerprint, namespace)`; each page's key is
`H(parent_key, tokens)`. H is BLAKE2b-128: keyed chains must not collide even for inputs an
attacker chooses (two namespaces never share a page), and the raw namespace string never
reaches disk, only its hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

KEY_BYTES = 16


def namespace_root_key(fingerprint: bytes, namespace: str) -> bytes:
    """The root key of a namespace's chain under one model fingerprint."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-ns")
    h.update(len(fingerprint).to_bytes(4, "little"))
    h.update(fingerprint)
    h.update(namespace.encode("utf-8"))
    return h.digest()


def page_key(parent_key: bytes, tokens: Sequence[int] | np.ndarray) -> bytes:
    """The key of a page holding `tokens` whose parent page (or namespace root) is `parent_key`."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tieredkv-page")
    h.update(parent_key)
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return h.digest()


def chain_keys(parent_key: bytes, tokens: Sequence[int], page_size: int) -> list[bytes]:
    """Keys of the consecutive full pages of `tokens` under `parent_key`."""
    keys = []
    array = np.asarray(tokens, dtype="<i4")
    for start in range(0, len(array) - page_size + 1, page_size):
        parent_key = page_key(parent_key, array[start : start + page_size])
        keys.append(parent_key)
    return keys
